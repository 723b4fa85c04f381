#!/usr/bin/env bash
# build_fork.sh FORK -- build a Caffe fork, CPU-only, library and pycaffe only, into /opt/FORK,
# as the oracle of tests/golden/forks (make_fork_golden.py). FORK: segnet | pspnet.
#
# Target: Debian 12 (bookworm) amd64, root; the same machine as ../../../shared/caffe's BVLC
# recipe (build_caffe.sh), whose three fixes these forks need too. Idempotent: a re-run skips
# what is done (unpack + patch once, make is incremental, install is cheap).
#
# SOURCE: the fork's repository at the commit FORK/fork.conf pins. With FORK_GIT_DIR set to a
# clone of it (bare or not), the tree is taken from there (git archive); else it is cloned
# from GitHub into /opt/FORK-src/git.
#
# PATCHES (FORK/patches/*.patch, applied in order with patch -p1; nothing else changes):
#   01-opencv4-constants: OpenCV 4 moved CV_LOAD_IMAGE_* (and the CV_INTER_* names SegNet's
#       io.cpp uses) to the legacy C headers: include them when CV_MAJOR_VERSION >= 4
#       (BVLC pull request 6693's fix, on these forks' io.cpp and window_data_layer.cpp).
#   02-boost-python3: cmake/Dependencies.cmake looks for Boost component "python-py3x"; Debian
#       names it "python3" / "python311" (Debian's cmake-link-correct-python-lib.patch).
#   03-protobuf-3.21: protobuf 3.21 has only the 1-argument SetTotalBytesLimit; call it with the
#       same limit (protobuf 3.x ignored the warning threshold anyway).
#   04-link-matio (pspnet): the CMake build never links libmatio, which the fork's MatRead /
#       MatWrite layers call (its Makefile does: USE_MATIO); without it pycaffe fails to load.
#   05-cpu-only-interp (pspnet): util/interp.hpp includes cublas_v2.h even in a CPU_ONLY build.
#
# BUILD: CMake with CPU_ONLY, OpenBLAS, OpenCV, LMDB, LevelDB, Python 3 layer; only the targets
# caffe and pycaffe (no tools, examples or tests), under nice -n 19 with JOBS (default 2) jobs.
# INSTALL: /opt/FORK/lib/libcaffe.so and /opt/FORK/python/caffe (pycaffe for Debian's
# /usr/bin/python3 and its numpy 1.24: the fixture script runs there, with numpy only).
#
#   sudo bash tools/oracles/build_fork.sh segnet      # then pspnet
#   PYTHONPATH=/opt/segnet/python /usr/bin/python3 -c 'import caffe'
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
FORK=${1:?usage: build_fork.sh segnet|pspnet}
[ -f "$HERE/$FORK/fork.conf" ] || { echo "no $HERE/$FORK/fork.conf" >&2; exit 1; }
# shellcheck source=/dev/null
source "$HERE/$FORK/fork.conf"
SRC=/opt/$FORK-src
PREFIX=/opt/$FORK
JOBS=${JOBS:-2}
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
unset PYTHONPATH PYTHONHOME VIRTUAL_ENV || true
export DEBIAN_FRONTEND=noninteractive
log() { echo "[build_fork $FORK] $*"; }

# ---------------------------------------------------------------- 1. Debian dependencies
DEPS=(build-essential cmake pkg-config patch git patchelf
      libboost-system-dev libboost-thread-dev libboost-filesystem-dev libboost-python-dev
      libprotobuf-dev protobuf-compiler libgoogle-glog-dev libgflags-dev
      libhdf5-dev liblmdb-dev libleveldb-dev libsnappy-dev libopenblas-dev libopencv-dev
      python3-dev python3-numpy python3-skimage python3-scipy python3-protobuf
      python3-yaml python3-six $EXTRA_DEPS)
missing=()
for p in "${DEPS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  log "apt-get install ${missing[*]}"
  apt-get update
  apt-get install -y --no-install-recommends "${missing[@]}"
fi

# ---------------------------------------------------------------- 2. source + patches (once)
STAMP="$SRC/src/.patched-$COMMIT"
if [ ! -f "$STAMP" ]; then
  rm -rf "$SRC/src" "$SRC/build"
  mkdir -p "$SRC/src"
  if [ -n "${FORK_GIT_DIR:-}" ]; then
    GIT=(git --git-dir="$FORK_GIT_DIR")
  else
    [ -d "$SRC/git" ] || git clone --bare "https://github.com/$REPO" "$SRC/git"
    GIT=(git --git-dir="$SRC/git")
  fi
  log "unpacking $REPO at $COMMIT"
  "${GIT[@]}" archive "$COMMIT" | tar x -C "$SRC/src"
  for p in "$HERE/$FORK"/patches/*.patch; do
    log "patch $(basename "$p")"
    patch -p1 --forward --no-backup-if-mismatch -d "$SRC/src" < "$p"
  done
  touch "$STAMP"
fi

# ---------------------------------------------------------------- 3. configure, build
mkdir -p "$SRC/build"
cd "$SRC/build"
cmake "$SRC/src" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$PREFIX" \
  -DCPU_ONLY=ON -DBLAS=Open -DUSE_OPENCV=ON -DUSE_LMDB=ON -DUSE_LEVELDB=ON \
  -DBUILD_python=ON -DBUILD_python_layer=ON -Dpython_version=3 \
  -DPYTHON_EXECUTABLE=/usr/bin/python3 -DBUILD_matlab=OFF -DBUILD_docs=OFF > cmake.log
log "nice -n 19 make -j$JOBS caffe pycaffe"
start=$(date +%s)
nice -n 19 make -j"$JOBS" caffe pycaffe
log "compiled in $(( $(date +%s) - start )) s"

# ---------------------------------------------------------------- 4. install, smoke test
mkdir -p "$PREFIX/lib" "$PREFIX/python"
cp -a "$SRC"/build/lib/libcaffe.so* "$PREFIX/lib/"
rm -rf "$PREFIX/python/caffe"
cp -rL "$SRC/src/python/caffe" "$PREFIX/python/caffe"
patchelf --set-rpath "$PREFIX/lib:/usr/lib/x86_64-linux-gnu/hdf5/serial" \
  "$PREFIX/python/caffe/_caffe.so"
PYTHONPATH="$PREFIX/python" /usr/bin/python3 -c \
  'import caffe; caffe.set_mode_cpu(); print("pycaffe OK:", caffe.__file__)'
log "done: $PREFIX"
