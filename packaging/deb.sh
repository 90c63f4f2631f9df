#!/usr/bin/env bash
# Builds the Debian package of settle from the release build:
#   packaging/deb.sh            → target/debian/settle_<version>-1_<arch>.deb
# Needs target/release/settle (cargo build --release -p settle --locked;
# built here when missing) and cargo-deb 3.x (cargo install --locked cargo-deb@3.8.0).
# Prints the package's path, and the settle-dbgsym package's.
# The completions and the man pages (one per command) come from the
# binary itself (`settle completions`, `settle man --dir`), so they match
# its flags.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
bin=$target/release/settle
if [ ! -x "$bin" ]; then
  cargo build --release -p settle --locked
fi
pkg=$target/release/pkg
mkdir -p "$pkg"
"$bin" completions bash > "$pkg/settle.bash"
"$bin" completions zsh > "$pkg/_settle"
"$bin" completions fish > "$pkg/settle.fish"
rm -rf "$pkg/man"
"$bin" man --dir "$pkg/man" >/dev/null
gzip -9n "$pkg/man"/*.1
command -v cargo-deb >/dev/null || { echo "cargo-deb is missing: cargo install --locked cargo-deb@3.8.0" >&2; exit 1; }
cargo deb -p settle --no-build "$@"
