// A large remote object read in fixed blocks (DatasetFs::MapFileInRanges, and OpenFile, of
// objects over RemoteFsOptions::whole_object_max_bytes): each block is a node-cache entry of
// its own, keyed by the object's version and the block, fetched with a range read of that
// version (If-Match) the first time a read needs it: one download per node and block,
// whichever job or rank asks first, and no more of a large .bin than its samples touch. A
// block no read holds is evicted like any other entry.
//
//   auto blocks = std::make_shared<const ObjectBlocks>(ObjectBlocks{...});
//   std::unique_ptr<RandomAccessFile> file = OpenBlocks(blocks, identity);
//   FERRY_ASSIGN_OR_RETURN(auto mapped, MapBlocks(blocks, identity, max_held_bytes));
//   mapped->Read(data, length, [&] { ... });  // fetches and maps just those blocks
//
// The caller has checked that the job's credentials may read this version (a HEAD).
// Thread-safe.
#ifndef FERRY_SERVER_REMOTE_OBJECT_BLOCKS_H_
#define FERRY_SERVER_REMOTE_OBJECT_BLOCKS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/cache/object_cache.h"
#include "server/dataset/dataset_fs.h"
#include "server/dataset/mapped_file.h"
#include "server/remote/store_client.h"

namespace ferry {

struct ObjectBlocks {
  std::string path;  // as the job named it, for errors
  ObjectLocation where;
  StoreClient::ObjectInfo info;  // the version read: its size and ETag
  ObjectCache::Key key;          // the whole object's; each block's adds its number
  uint64_t block_bytes = 0;      // > 0, a multiple of the page size
  std::shared_ptr<ObjectCache> cache;
  std::shared_ptr<const StoreClient> store;

  uint64_t num_blocks() const { return (info.size + block_bytes - 1) / block_bytes; }
  uint64_t BlockSize(uint64_t block) const;
  // Block `block`'s cache entry, fetched when absent; the time it takes is the calling
  // thread's remote wait (TallyRemoteWait). Errors as ObjectCache::Get and
  // StoreClient::Read give them; those that are not IsTransientReadError (the store refuses
  // the object, it is gone or changed) also StopsTheJob.
  absl::StatusOr<ObjectCache::Pin> Block(uint64_t block) const;
};

// One pread of up to out.size() bytes of a cache entry at `offset`, timed as a local read
// (TallyRead); errors as FileErrnoStatus gives them, naming `path` (the object). What a
// RandomAccessFile over cache entries (a whole object's, or a block's) reads with.
absl::StatusOr<size_t> ReadCacheEntry(const ObjectCache::Pin& pin, uint64_t offset,
                                      absl::Span<uint8_t> out, const std::string& path);

// Reads (pread) from the blocks' entries, fetching each block when a read first needs it.
std::unique_ptr<RandomAccessFile> OpenBlocks(std::shared_ptr<const ObjectBlocks> blocks,
                                             const FileIdentity& identity);

// A mapping of the whole object's size (address space only) in which a ranged
// MappedFile::Read maps the blocks it needs from their entries and holds them while it
// runs (read_in_ranges). Blocks no read holds stay mapped, most recently read last, until
// more than `max_held_bytes` are mapped; then the oldest are unmapped and let go, to the
// cache's eviction. ENOMEM (as RESOURCE_EXHAUSTED) when the address space cannot be
// reserved.
absl::StatusOr<std::shared_ptr<const MappedFile>> MapBlocks(
    std::shared_ptr<const ObjectBlocks> blocks, const FileIdentity& identity,
    uint64_t max_held_bytes);

}  // namespace ferry

#endif  // FERRY_SERVER_REMOTE_OBJECT_BLOCKS_H_
