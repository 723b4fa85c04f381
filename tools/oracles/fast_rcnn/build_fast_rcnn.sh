#!/usr/bin/env bash
# build_fast_rcnn.sh -- build Faster R-CNN's Caffe fork (rbgirshick/caffe-fast-rcnn at the
# commit py-faster-rcnn pins as its submodule), CPU-only, into /opt/fast-rcnn.
#
# What it gives caffe-py: ROIPooling's forward (the fork's only CPU code for its own layers:
# SmoothL1Loss and ROIPooling's backward are CUDA-only, see
# tests/golden/forks/make_kernel_golden.py), and pycaffe to count the parameters of Faster
# R-CNN's prototxts with their Python layers. Debian 12, root, the Debian libraries of
# ../ssd/build_ssd.sh.
#
#   FAST_RCNN_GIT=/path/to/caffe-fast-rcnn bash tools/oracles/fast_rcnn/build_fast_rcnn.sh
#
# FAST_RCNN_GIT is a clone (or bare git directory) holding commit 0dcd397: py-faster-rcnn's
# caffe-fast-rcnn submodule, branch faster-rcnn-upstream-33f2445. (Branch faster-rcnn's head
# 4115385 is the same change set, the same layer sources, on an older BVLC Caffe whose
# caffe.proto lacks fields the published prototxts write, such as lrn_param.engine.) Without
# it the script clones the repository. Idempotent.
#
# Built: the library, pycaffe (with the Python layer) and the `caffe` tool, with
# `nice -n 19 make -j2`; installed into PREFIX (/opt/fast-rcnn), never over /opt/caffe;
# _caffe.so recompiled against numpy 2 headers as for BVLC Caffe. Patches: debian12.patch
# beside this script (boost-python naming, OpenCV 4's legacy constants, protobuf 3.21's
# SetTotalBytesLimit); nothing that changes a computation.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
COMMIT=0dcd397b29507b8314e252e850518c5695efbb83
SRC=${SRC:-/opt/fast-rcnn-src}
PREFIX=${PREFIX:-/opt/fast-rcnn}
JOBS=${JOBS:-2}
NUMPY2_VER=2.4.6          # only its C headers are used
[ "$PREFIX" != /opt/caffe ] || { echo "refusing to install over /opt/caffe"; exit 1; }
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
unset PYTHONPATH PYTHONHOME VIRTUAL_ENV || true
export DEBIAN_FRONTEND=noninteractive
log() { echo "[build_fast_rcnn] $*"; }

# ---------------------------------------------------------------- 1. Debian dependencies
DEPS=(build-essential cmake pkg-config patch git ca-certificates
      libboost-system-dev libboost-thread-dev libboost-filesystem-dev libboost-python-dev
      libboost-regex-dev libprotobuf-dev protobuf-compiler libgoogle-glog-dev libgflags-dev
      libhdf5-dev liblmdb-dev libleveldb-dev libsnappy-dev libopenblas-dev libopencv-dev
      python3-dev python3-numpy python3-pip python3-skimage python3-scipy python3-protobuf
      python3-six)
missing=()
for p in "${DEPS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  log "apt-get install ${missing[*]}"
  apt-get update
  apt-get install -y --no-install-recommends "${missing[@]}"
fi

# ---------------------------------------------------------------- 2. source + patch (once)
STAMP="$SRC/caffe/.patched-$COMMIT"
if [ ! -f "$STAMP" ]; then
  GIT=${FAST_RCNN_GIT:-}
  if [ -z "$GIT" ]; then
    GIT="$SRC/clone"
    [ -d "$GIT" ] || git clone --branch faster-rcnn-upstream-33f2445 \
      https://github.com/rbgirshick/caffe-fast-rcnn.git "$GIT"
  fi
  log "unpacking $COMMIT from $GIT into $SRC/caffe"
  rm -rf "$SRC/caffe" "$SRC/build"
  mkdir -p "$SRC/caffe"
  git --git-dir="$( [ -d "$GIT/.git" ] && echo "$GIT/.git" || echo "$GIT")" archive "$COMMIT" \
    | tar x -C "$SRC/caffe"
  (cd "$SRC/caffe" && patch -p1 --forward < "$HERE/debian12.patch")
  touch "$STAMP"
fi

# ---------------------------------------------------------------- 3. configure, build
mkdir -p "$SRC/build"
cd "$SRC/build"
cmake "$SRC/caffe" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$PREFIX" \
  -DCPU_ONLY=ON -DBLAS=Open -DUSE_OPENCV=ON -DUSE_LMDB=ON -DUSE_LEVELDB=ON \
  -DBUILD_python=ON -DBUILD_python_layer=ON -Dpython_version=3 \
  -DPYTHON_EXECUTABLE=/usr/bin/python3 -DBUILD_matlab=OFF -DBUILD_docs=OFF
log "nice -n 19 make -j$JOBS caffe pycaffe caffe.bin"
nice -n 19 make -j"$JOBS" caffe pycaffe caffe.bin

# ---------------------------------------------------------------- 4. install (what was built)
mkdir -p "$PREFIX/bin" "$PREFIX/lib"
cp -a "$SRC/build/lib/"libcaffe.so* "$PREFIX/lib/"
install -m 755 "$SRC/build/tools/caffe" "$PREFIX/bin/"
rm -rf "$PREFIX/python" && cp -a "$SRC/caffe/python" "$PREFIX/python"
cp "$SRC/build/include/caffe/proto/caffe_pb2.py" "$PREFIX/python/caffe/proto/" 2>/dev/null || \
  cp "$SRC/caffe/python/caffe/proto/caffe_pb2.py" "$PREFIX/python/caffe/proto/"
for b in "$PREFIX/bin/caffe"; do
  patchelf --set-rpath "$PREFIX/lib:/usr/lib/x86_64-linux-gnu/hdf5/serial" "$b" 2>/dev/null || true
done

# ---------------------------------------------------------------- 5. pycaffe for numpy 2
NP2="$SRC/numpy2"
NP2INC="$NP2/np/numpy/_core/include"
if [ ! -f "$NP2INC/numpy/arrayobject.h" ]; then
  log "fetching numpy $NUMPY2_VER wheel from PyPI for its headers"
  rm -rf "$NP2"; mkdir -p "$NP2/np"
  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.11 \
    --platform manylinux_2_28_x86_64 "numpy==$NUMPY2_VER" -d "$NP2"
  python3 -m zipfile -e "$NP2"/numpy-"$NUMPY2_VER"-*.whl "$NP2/np"
fi
FLAGS="$SRC/build/python/CMakeFiles/pycaffe.dir/flags.make"
OUT="$SRC/build-np2/_caffe.so"
mkdir -p "$SRC/build-np2"
DEFS=$(sed -n 's/^CXX_DEFINES = //p' "$FLAGS")
INCS=$(sed -n 's/^CXX_INCLUDES = //p' "$FLAGS")
# shellcheck disable=SC2086
nice -n 19 c++ -O2 -DNDEBUG -fPIC -Wno-deprecated-declarations -I"$NP2INC" $DEFS $INCS -shared \
  -Wl,-soname,_caffe.so -o "$OUT" "$SRC/caffe/python/caffe/_caffe.cpp" \
  -Wl,-rpath,"$PREFIX/lib:/usr/lib/x86_64-linux-gnu/hdf5/serial" -L"$PREFIX/lib" -lcaffe \
  -lpython3.11 -lboost_python311 -lboost_system -lboost_thread -lglog -lgflags -lprotobuf
install -m 755 "$OUT" "$PREFIX/python/caffe/_caffe.so"

# ---------------------------------------------------------------- 6. smoke test
LD_LIBRARY_PATH="$PREFIX/lib" "$PREFIX/bin/caffe" --version
PYTHONPATH="$PREFIX/python" /usr/bin/python3 -c \
  'import caffe; caffe.set_mode_cpu(); from caffe.proto import caffe_pb2; caffe_pb2.ROIPoolingParameter; print("Faster R-CNN pycaffe OK:", caffe.__file__)'
log "done: $PREFIX"
