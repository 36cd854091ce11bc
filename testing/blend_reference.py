"""A pure-Python reference of ferry's epoch order for tests: the sampler (shuffle, padding,
rank striding, batches: server/sampler/sampler.h) and the blend's mapping of positions to
samples (server/dataset/blend_source.h), written the slow, obvious way from their contracts.
Integers are Python's, masked to 64 bits where C++ wraps."""

MASK = (1 << 64) - 1


def mix64(x):
    """SplitMix64's finalizer (common/random.h Mix64)."""
    x = (x + 0x9e3779b97f4a7c15) & MASK
    x = ((x ^ (x >> 30)) * 0xbf58476d1ce4e5b9) & MASK
    x = ((x ^ (x >> 27)) * 0x94d049bb133111eb) & MASK
    return x ^ (x >> 31)


def mix_seed(seed, a, b=0):
    return mix64(mix64(mix64(seed) ^ a) ^ ((b * 0xd1b54a32d192ed03) & MASK))


class Rng:
    """common/random.h Rng: a SplitMix64 stream."""

    def __init__(self, seed):
        self.state = seed & MASK

    def next(self):
        self.state = (self.state + 0x9e3779b97f4a7c15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & MASK
        z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & MASK
        return z ^ (z >> 31)

    def below(self, n):
        return (self.next() * n) >> 64


def index_permutation(n, key, i):
    """common/random.h IndexPermutation(n, key)(i): a 6-round Feistel network over the
    smallest even bit count holding n, cycle-walked below n."""
    bits = 1 if n <= 2 else (n - 1).bit_length()
    half = (bits + 1) // 2
    mask = (1 << half) - 1
    keys = [mix64((key + r) & MASK) for r in range(6)]
    x = i
    while True:
        left, right = x >> half, x & mask
        for k in keys:
            left, right = right, left ^ (mix64(right ^ k) & mask)
        x = (left << half) | right
        if x < n:
            return x


def epoch_order(n, seed, epoch, shuffle):
    """The sampler's order of [0, n) for an epoch: Fisher-Yates from the back."""
    order = list(range(n))
    if shuffle:
        rng = Rng(mix_seed(seed, epoch))
        for i in range(n - 1, 0, -1):
            j = rng.below(i + 1)
            order[i], order[j] = order[j], order[i]
    return order


def rank_batches(n, batch_size, world, rank, seed, epoch, shuffle, drop_last=False):
    """Positions of each batch of `rank` (DistributedSampler + BatchSampler semantics)."""
    order = epoch_order(n, seed, epoch, shuffle)
    total = (n // world if drop_last or n % world == 0 else n // world + 1) * world
    padded = [order[p % n] for p in range(total)]
    mine = padded[rank::world]
    batches = [mine[b:b + batch_size] for b in range(0, len(mine), batch_size)]
    if drop_last and batches and len(batches[-1]) < batch_size:
        batches.pop()
    return batches


class Blend:
    """A blend of sources with `sizes` and `weights` (positions -> concatenated indices)."""

    PASS_KEY_TAG = 0x626c656e64706173

    def __init__(self, sizes, weights, samples_per_epoch=None):
        self.sizes = list(sizes)
        total = sum(weights)
        self.weights = [w / total for w in weights]
        self.offsets = [0]
        for s in self.sizes:
            self.offsets.append(self.offsets[-1] + s)
        n = samples_per_epoch or sum(self.sizes)
        # Megatron's build_blending_indices: the source lagging weight * max(p, 1) the most.
        self.source_of, self.rank_in_source = [], []
        count = [0] * len(self.sizes)
        for p in range(n):
            target = float(max(p, 1))
            errors = [w * target - c for w, c in zip(self.weights, count)]
            best = errors.index(max(errors))  # the first of equal maxima
            self.source_of.append(best)
            self.rank_in_source.append(count[best])
            count[best] += 1
        self.per_epoch = count

    def __len__(self):
        return len(self.source_of)

    def index_at(self, seed, epoch, shuffle, position):
        s = self.source_of[position]
        draw = epoch * self.per_epoch[s] + self.rank_in_source[position]
        local = draw % self.sizes[s]
        if shuffle:
            key = mix_seed(seed, self.PASS_KEY_TAG + s, draw // self.sizes[s])
            local = index_permutation(self.sizes[s], key, local)
        return self.offsets[s] + local
