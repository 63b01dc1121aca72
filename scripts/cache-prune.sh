# Sourced by the scripts that cache builds under $HOME/.cache/volmgr: each new
# build is kept under a key of its inputs, so without pruning every change of
# libvolmgr.a or of the pinned modules would leave ~120-300 MB behind (19
# kubelet forks had piled up, and a CI run then ran out of disk).

# prune_cache PREFIX KEEP: remove all but the KEEP newest "$PREFIX"-* builds
# (and any half-built "$PREFIX"-*.tmp other than the newest ones).
prune_cache() {
  local prefix=$1 keep=$2 dir
  dir=$(dirname "$prefix")
  [ -d "$dir" ] || return 0
  # Only directories named PREFIX-<16 hex digits>[.tmp]: never the work dir.
  find "$dir" -maxdepth 1 -mindepth 1 -type d -regextype posix-extended \
       -regex "$prefix-[0-9a-f]{16}(\.tmp)?" -printf '%T@ %p\n' \
    | sort -rn | tail -n +"$((keep + 1))" | cut -d' ' -f2- \
    | while IFS= read -r old; do rm -rf -- "$old"; done
}
