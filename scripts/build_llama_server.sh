#!/usr/bin/env bash
# Build llama.cpp's C++ `llama-server` (continuous batching, --parallel, --metrics, /slots) from the
# llama.cpp source vendored in the llama-cpp-python sdist that speedlimit already pins, so the
# second real engine matches the first one's llama.cpp version. Cached: a second run with a working
# binary does nothing. Progress goes to stderr; the last stdout line is the binary's path.
#
#   scripts/build_llama_server.sh            # build (about 7 minutes on 2 cores) or reuse
#   SPEEDLIMIT_CACHE_DIR=/some/dir scripts/build_llama_server.sh
#
# Env: SPEEDLIMIT_CACHE_DIR (default ~/.cache/speedlimit), PYTHON (interpreter whose pip downloads
# the sdist; default python3), SPEEDLIMIT_BUILD_JOBS (default: number of CPUs).
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION="0.3.36"  # keep equal to the pin in pyproject.toml
CACHE_DIR="${SPEEDLIMIT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/speedlimit}"
ROOT="$CACHE_DIR/llama-server/$LLAMA_CPP_PYTHON_VERSION"
BINARY="$ROOT/build/bin/llama-server"
PYTHON="${PYTHON:-python3}"
JOBS="${SPEEDLIMIT_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}"

works() { [ -x "$BINARY" ] && "$BINARY" --version >/dev/null 2>&1; }

if works; then
    echo "$BINARY"
    exit 0
fi

for tool in cmake c++ tar; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "error: building llama-server needs $tool on PATH (Debian: apt-get install cmake g++)" >&2
        exit 2
    fi
done

mkdir -p "$ROOT"
# Two callers (CI and a test session) must not build into the same directory at once.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$ROOT/.lock"
    flock 9
    if works; then  # the other caller finished it while we waited
        echo "$BINARY"
        exit 0
    fi
fi

SDIST="$ROOT/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
if [ ! -f "$SDIST" ]; then
    echo "downloading the llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sdist into $ROOT" >&2
    rm -rf "$ROOT/download"
    "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: \
        "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$ROOT/download" >&2
    mv "$ROOT/download/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz" "$SDIST"
    rm -rf "$ROOT/download"
fi

SOURCE="$ROOT/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"
if [ ! -f "$SOURCE/CMakeLists.txt" ]; then
    echo "extracting $SDIST" >&2
    tar -xzf "$SDIST" -C "$ROOT"
fi

# GGML_NATIVE=OFF: the same portable CPU build the README asks of llama-cpp-python.
# LLAMA_USE_PREBUILT_UI=OFF: the UI step would otherwise fetch assets from Hugging Face at build time.
# BUILD_SHARED_LIBS=OFF: one self-contained binary.
echo "building llama-server with $JOBS jobs (log: $ROOT/build.log)" >&2
{
    cmake -S "$SOURCE" -B "$ROOT/build" \
        -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=OFF \
        -DGGML_NATIVE=OFF \
        -DLLAMA_BUILD_SERVER=ON \
        -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_BUILD_UI=OFF \
        -DLLAMA_USE_PREBUILT_UI=OFF \
        -DLLAMA_OPENSSL=OFF
    cmake --build "$ROOT/build" --target llama-server -j "$JOBS"
} >"$ROOT/build.log" 2>&1 || {
    echo "llama-server build failed; last lines of $ROOT/build.log:" >&2
    tail -n 30 "$ROOT/build.log" >&2
    exit 1
}

if ! works; then
    echo "built $BINARY but it does not run '--version'; see $ROOT/build.log" >&2
    exit 1
fi
echo "$BINARY"
