#!/usr/bin/env bash
# Files back from a lent CUDA machine, whose runs return at most 8 files of 16 MiB (64 MiB) each:
# `collect` packs what it is given into pieces of 15 MiB once (with their sha256 sums) and copies
# four of them into $OUT each call (START=N from the N-th on; it says how many calls are needed);
# `unpack` checks the pieces gathered from the folders the calls came back to and unpacks them.
#   there:  bash bench/gpu_pieces.sh collect PIECES_DIR -C DIR MEMBER... [-C DIR MEMBER...]
#   here:   bash bench/gpu_pieces.sh unpack DEST DIR...
# PIECES_DIR keeps the pieces between calls (a folder under /tmp there); the tar options after it
# name what goes in (tar's own -C, --transform...).
set -euo pipefail
case ${1:-} in
collect)
    [ $# -gt 2 ] || { echo "usage: bash bench/gpu_pieces.sh collect PIECES_DIR TAR_ARGS..." >&2; exit 2; }
    pieces_dir=$2
    out=${OUT:?set OUT}
    shift 2
    if [ ! -f "$pieces_dir/sums.txt" ]; then
        rm -rf "$pieces_dir" && mkdir -p "$pieces_dir"
        tar -cf - "$@" | split -b 15M -d -a 3 - "$pieces_dir/piece-"
        (cd "$pieces_dir" && sha256sum piece-* > sums.txt.partial && mv sums.txt.partial sums.txt)
    fi
    start=${START:-0}
    pieces=("$pieces_dir"/piece-*)
    cp "$pieces_dir/sums.txt" "$out/"
    for piece in "${pieces[@]:start:4}"; do cp "$piece" "$out/"; done
    echo "${#pieces[@]} pieces, calls needed: $(((${#pieces[@]} + 3) / 4)); next START=$((start + 4))"
    ;;
unpack)
    [ $# -gt 2 ] || { echo "usage: bash bench/gpu_pieces.sh unpack DEST DIR..." >&2; exit 2; }
    dest=$2
    shift 2
    gathered=$(mktemp -d)
    trap 'rm -rf "$gathered"' EXIT
    for from in "$@"; do cp "$from"/piece-* "$from"/sums.txt "$gathered/"; done
    (cd "$gathered" && sha256sum -c --quiet sums.txt)
    mkdir -p "$dest"
    cat "$gathered"/piece-* | tar -xf - -C "$dest"
    ;;
*)
    echo "usage: bash bench/gpu_pieces.sh collect|unpack" >&2
    exit 2
    ;;
esac
