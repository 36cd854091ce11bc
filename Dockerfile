# ferryd in a container: build on Debian 12 from Debian's packages (the same ones
# deploy/install-deps.sh installs for everyone else), run on debian:12-slim.
#
#   docker build -t ferry:0.1.0 .                      # with the CUDA transport
#   docker build -t ferry:0.1.0 --build-arg WITH_CUDA=0 .   # host transport only
#   docker run --rm --gpus all --ipc=host -v /run/ferry:/run/ferry -v /data:/data:ro \
#       ferry:0.1.0 --config /etc/ferry/ferryd.conf
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
RUN cmake --preset default -DCMAKE_INSTALL_PREFIX=/usr \
      -DFERRY_BUILD_TESTS=OFF -DFERRY_BUILD_BENCH=OFF \
 && cmake --build --preset default -j"$(nproc)" \
 && DESTDIR=/stage cmake --install build \
 && install -D -m 0644 deploy/ferryd.conf.example /stage/usr/share/doc/ferry/ferryd.conf.example \
 && install -m 0644 docs/*.md /stage/usr/share/doc/ferry/
# CUDA runtime libraries the binaries link dynamically (none when cudart is linked
# statically, CMake's default) travel with them; libcuda itself stays the host's.
RUN mkdir -p /stage/usr/local/lib \
 && find /stage -type f \( -perm -u+x -o -name '*.so*' \) -print0 \
    | xargs -0 -r ldd 2>/dev/null \
    | awk '$3 ~ /^\/usr\/local\/cuda/ { print $3 }' | sort -u \
    | xargs -r cp -L -t /stage/usr/local/lib/

# ---- runtime --------------------------------------------------------------------------
FROM debian:12-slim

# Runtime halves of deploy/install-deps.sh's -dev packages: gRPC 1.51, protobuf 3.21,
# abseil 20220623, libnuma, libjpeg-turbo, libspng, libsystemd (sd_notify; a no-op without
# NOTIFY_SOCKET), cpp-httplib (the metrics endpoint).
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends \
      libgrpc++1.51 libprotobuf32 libabsl20220623 libnuma1 libjpeg62-turbo libspng0 libsystemd0 \
      libcpp-httplib0.11 \
 && rm -rf /var/lib/apt/lists/*

# ferryd -> /usr/sbin, ferryctl -> /usr/bin, libferry.so -> /usr/lib/<multiarch>, the
# C header and the Python package as the CMake install rules place them. Trainers use
# the Python package from their own image; this one only runs the daemon.
COPY --from=build /stage/ /
RUN ldconfig \
 && groupadd --system --gid 7070 ferry \
 && useradd --system --uid 7070 --gid ferry --no-create-home --home-dir / \
      --shell /usr/sbin/nologin ferry \
 && install -d -o ferry -g ferry -m 0750 /run/ferry \
 && install -d -m 0755 /etc/ferry

# The NVIDIA container toolkit reads these: all GPUs, compute only.
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

USER ferry
# SIGTERM drains consumers for drain_timeout_seconds (default 5 s) before exiting.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/sbin/ferryd", "--listen", "/run/ferry/ferryd.sock"]
