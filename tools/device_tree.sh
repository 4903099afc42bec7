#!/bin/bash
# The working tree a GPU call copies, cut to what its jobs read: the committed results grew past
# the size a call may carry (64 MiB), and a job reads only its own folder. Git's sparse checkout
# takes every results folder out of the working tree but the ones named, so `git status` stays
# clean and nothing committed is lost; `restore` brings them all back.
#
#     bash tools/device_tree.sh keep results/reproduce/opt-13b-h200 [FOLDER...]
#     ... device calls (tools/device_call.sh), results unpacked into the kept folders ...
#     bash tools/device_tree.sh restore
#
# Only folders two levels under results/ (results/<kind>/<name>) are taken out; results written
# into a folder that was not kept would be hidden by git until `restore`, so keep every folder the
# jobs of the calls write (tools/device_call.sh names each job's folder), each whole: a
# reproduction's jobs rewrite its folder's reproduce.md and claims.md from every figure found in
# it, so a figure taken out of the tree would be left out of them. Runs a seed set aside
# (`earlier/` folders: kept as evidence, read by no job) are taken out of kept folders too.
set -eu
cd "$(git rev-parse --show-toplevel)"
case ${1:-} in
  keep)
    shift
    patterns=('/*' '!/results/*/*/')
    for folder in "$@"; do
      folder=${folder%/}
      [ -d "$folder" ] || { echo "device_tree.sh: no folder $folder" >&2; exit 2; }
      patterns+=("/$folder/")
    done
    patterns+=('!/results/**/earlier/')
    git sparse-checkout set --no-cone "${patterns[@]}"
    echo "kept: ${*:-no results folder}; $(git ls-files -t | grep -c '^S') tracked files out of the tree" ;;
  restore)
    git sparse-checkout disable
    echo "every tracked file back in the tree" ;;
  *)
    echo "usage: device_tree.sh keep FOLDER... | restore" >&2; exit 2 ;;
esac
