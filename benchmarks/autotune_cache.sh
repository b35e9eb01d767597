# Sourced by the GPU scripts: Triton's autotuning results carried between device calls.
# fla autotunes every kernel in every fresh process (minutes per shape; its delta kernels at one of fla's
# benchmark shapes can outlast a call); Triton keeps the results as *.autotune.json files in its cache
# (TRITON_CACHE_DIR, default ~/.triton/cache). `autotune_restore` unpacks AUTOTUNE_IN (an earlier call's
# archive, carried) into that cache; `autotune_pack OUT_DIR` packs every result there into
# OUT_DIR/triton-autotune.tgz, the next call's AUTOTUNE_IN (the scripts run it on exit).
_autotune_dir=${TRITON_CACHE_DIR:-$HOME/.triton/cache}

autotune_restore() {
  if [[ -n "${AUTOTUNE_IN:-}" && -f "$AUTOTUNE_IN" ]]; then
    mkdir -p "$_autotune_dir" && tar xzf "$AUTOTUNE_IN" -C "$_autotune_dir" &&
      echo "restored $(tar tzf "$AUTOTUNE_IN" | grep -c 'autotune\.json$') autotune results"
  fi
}

autotune_pack() {
  local dest
  dest="$(cd "$1" && pwd)/triton-autotune.tgz"
  (cd "$_autotune_dir" 2> /dev/null && find . -name '*.autotune.json' | tar czf "$dest" -T -)
}
