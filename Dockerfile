# ferryd in a container: build on Debian 12 from Debian's packages (the same ones
# deploy/install-deps.sh installs for everyone else), make ferry's Debian packages with
# CPack, and install those on debian:12-slim, as apt would on a host: the image runs what
# the .debs hold, and apt brings their run-time dependencies.
#
#   docker build -t ferry:0.1.0 .                      # with the CUDA transport
#   docker build -t ferry:0.1.0 --build-arg WITH_CUDA=0 .   # host transport only
#   docker run --rm --gpus all --ipc=host -v /run/ferry:/run/ferry -v /data:/data:ro \
#       -v /etc/ferry/ferryd.conf:/etc/ferry/ferryd.conf:ro ferry:0.1.0
#
# The container runs as user ferry (uid/gid 7070; deploy/kubernetes uses the same ids).
# Kubernetes: deploy/kubernetes/ferryd-daemonset.yaml. Details: docs/operations.md.

# ---- build ----------------------------------------------------------------------------
FROM debian:12 AS build

# The CUDA toolkit is optional: without it ferryd is built with the host transport only
# (WITH_CUDA=0). With it, nvcc and the CUDA runtime come from NVIDIA's Debian 12
# repository; the driver (libcuda) is never part of the image, the NVIDIA container
# toolkit mounts the host's at run time.
ARG WITH_CUDA=1
ARG CUDA_VERSION=13-0

COPY deploy/install-deps.sh /src/deploy/install-deps.sh
RUN bash /src/deploy/install-deps.sh && rm -rf /var/lib/apt/lists/*

RUN if [ "$WITH_CUDA" = 1 ]; then \
      set -eux; \
      arch=$(uname -m); [ "$arch" = aarch64 ] && arch=sbsa; \
      apt-get update -qq; \
      apt-get install -y -qq --no-install-recommends curl; \
      curl -fsSL -o /tmp/cuda-keyring.deb \
        "https://developer.download.nvidia.com/compute/cuda/repos/debian12/$arch/cuda-keyring_1.1-1_all.deb"; \
      dpkg -i /tmp/cuda-keyring.deb; rm /tmp/cuda-keyring.deb; \
      apt-get update -qq; \
      apt-get install -y -qq --no-install-recommends \
        "cuda-nvcc-$CUDA_VERSION" "cuda-cudart-dev-$CUDA_VERSION"; \
      rm -rf /var/lib/apt/lists/*; \
    fi
# CMake's check_language(CUDA) finds nvcc on PATH; absent, it configures without CUDA.
ENV PATH=/usr/local/cuda/bin:$PATH

COPY . /src
WORKDIR /src
# The preset's build dir (build/) and build type; tests and benchmarks are not shipped.
# The CUDA runtime is linked statically, so the packages need nothing of CUDA's; libcuda
# stays the host's.
RUN cmake --preset default -DCMAKE_INSTALL_PREFIX=/usr \
      -DFERRY_BUILD_TESTS=OFF -DFERRY_BUILD_BENCH=OFF \
 && cmake --build --preset default -j"$(nproc)" \
 && (cd build && cpack) \
 && mkdir -p /debs && cp build/packages/ferryd_*.deb build/packages/libferry1_*.deb /debs/

# ---- runtime --------------------------------------------------------------------------
FROM debian:12-slim

# The user first, with the ids deploy/kubernetes uses: the ferryd package's postinst then
# finds it and creates none. apt installs the packages and their run-time dependencies
# (dpkg-shlibdeps' list: gRPC, protobuf, abseil, libnuma, libjpeg-turbo, libspng,
# libsystemd, cpp-httplib) from Debian. Trainers use the Python package from their own
# image; this one only runs the daemon (ferryd, ferryctl, /etc/ferry/ferryd.conf).
COPY --from=build /debs/ /tmp/debs/
RUN groupadd --system --gid 7070 ferry \
 && useradd --system --uid 7070 --gid ferry --no-create-home --home-dir / \
      --shell /usr/sbin/nologin ferry \
 && apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends /tmp/debs/*.deb \
 && rm -rf /var/lib/apt/lists/* /tmp/debs \
 && install -d -o ferry -g ferry -m 0750 /run/ferry

# The NVIDIA container toolkit reads these: all GPUs, compute only.
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

USER ferry
# SIGTERM drains consumers for drain_timeout_seconds (default 5 s) before exiting.
STOPSIGNAL SIGTERM
# The system daemon: the packaged config (unix_socket /run/ferry/ferryd.sock, dataset_roots);
# mount your own over /etc/ferry/ferryd.conf.
ENTRYPOINT ["/usr/sbin/ferryd", "--config", "/etc/ferry/ferryd.conf"]
