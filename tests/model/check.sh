#!/bin/sh
# Model-check the per-lane claim-floor protocol (tests/model/floor.pml, csrc/floor.c) with spin.
#
#   sh tests/model/check.sh
#
# 1. Exhaustive searches of the model, each of which must end with "errors: 0" over a nonzero
#    number of states, searched to the end (no depth or memory bound reached):
#      default  one write, two claimers, a compactor
#      claims   two writes, two claimers, no compactor, any starting row table
#      merge    two writes, one claimer, a compactor
# 2. Deliberately broken variants, in which spin must find an assertion violation (so the
#    property provably catches each bug): BROKEN_RAISE and BROKEN_LOWER (claims), BROKEN_GEN,
#    (default), BROKEN_RING_MIN (merge), BROKEN_PROPOSAL (claims), BROKEN_FRESH (merge: a moved
#    row lost, caught by the end check that every queued row is findable); and a sanity run,
#    REACH_TOP (default), whose violation shows that the floor does get raised to the top
#    minute. Each counterexample is printed step by step.
#
# SPIN_DEFINES is added to every run (e.g. SPIN_DEFINES=-DLITERAL_CAS_LOOPS). Work happens in a
# temporary directory that is removed on exit: nothing is left in the repository.
# Exit status: 0 all as expected, 1 a search did not end as expected, 2 spin or a compiler is
# missing, or the model does not build.
set -u

here=$(CDPATH='' cd -- "$(dirname -- "$0")" && pwd) || exit 2
model="$here/floor.pml"
CC=${CC:-gcc}

if ! command -v spin >/dev/null 2>&1; then
    echo "check.sh: spin is not installed. Install it (Debian's package) with:" >&2
    echo "    apt-get install -y spin        (or: make spin)" >&2
    exit 2
fi
if ! command -v "$CC" >/dev/null 2>&1; then
    echo "check.sh: no C compiler ($CC) to build spin's verifier" >&2
    exit 2
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/floor-model.XXXXXX") || exit 2
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

extra=${SPIN_DEFINES:-}
failed=0

# search NAME [-DNAME...]: generate, build and run the verifier in $work/NAME; sets $dir,
# $errors, $states and $complete (1 when the search reached its end).
search() {
    name=$1
    shift
    dir="$work/$name"
    mkdir "$dir" && cp "$model" "$dir/floor.pml" || exit 2
    # shellcheck disable=SC2086  # $extra is a list of words
    if ! (cd "$dir" && spin -a "$@" $extra floor.pml >spin.log 2>&1); then
        echo "check.sh: spin -a $* $extra floor.pml failed:" >&2
        cat "$dir/spin.log" >&2
        exit 2
    fi
    if ! (cd "$dir" && "$CC" -O2 -w -DSAFETY -DMEMLIM=4096 -o pan pan.c >cc.log 2>&1); then
        echo "check.sh: building the verifier ($*) failed:" >&2
        cat "$dir/cc.log" >&2
        exit 2
    fi
    (cd "$dir" && ./pan -m10000 >pan.log 2>&1)
    errors=$(sed -n 's/.*errors: \([0-9][0-9]*\).*/\1/p' "$dir/pan.log" | head -n 1)
    states=$(awk '/states, stored/ { print $1; exit }' "$dir/pan.log")
    elapsed=$(sed -n 's/^pan: elapsed time \([0-9.e+]*\).*/\1/p' "$dir/pan.log" | head -n 1)
    complete=1
    if grep -q -e 'too small' -e 'MEMLIM' -e 'out of memory' "$dir/pan.log"; then complete=0; fi
    : "${errors:=}" "${states:=0}" "${elapsed:=?}"
    flags=$(echo "$* $extra" | sed 's/^ *//; s/ *$//')
    : "${flags:=the defaults}"
}

# trail [-DNAME...]: the counterexample just found, one line per step of the model.
trail() {
    # shellcheck disable=SC2086
    (cd "$dir" && spin -t "$@" $extra floor.pml 2>&1) |
        sed -n -e 's/^ *MSC: /      /p' -e 's/^spin: text of failed assertion: /      violated: /p'
}

expect_verified() {
    name=$1
    shift
    search "$name" "$@"
    if [ "$errors" = 0 ] && [ "$states" != 0 ] && [ "$complete" = 1 ]; then
        echo "ok    $name ($flags): errors: 0, $states states, ${elapsed} s"
    else
        failed=1
        echo "FAIL  $name ($flags): errors: ${errors:-?}, $states states, ${elapsed} s" \
            "(complete: $complete)"
        grep -e '^pan:[0-9]*:' -e 'too small' -e 'MEMLIM' -e 'out of memory' "$dir/pan.log" |
            sed 's/^/      /'
        if [ -f "$dir/floor.pml.trail" ]; then
            echo "      counterexample:"
            trail "$@"
        fi
    fi
}

expect_caught() {
    name=$1
    shift
    search "$name" "$@"
    if [ "${errors:-0}" != 0 ] && grep -q 'assertion violated' "$dir/pan.log" &&
        [ -f "$dir/floor.pml.trail" ]; then
        depth=$(sed -n 's/.*assertion violated.*(at depth \([0-9]*\)).*/\1/p' "$dir/pan.log")
        echo "ok    $name ($flags): caught, errors: $errors, at depth $depth, after $states states:"
        trail "$@"
    else
        failed=1
        echo "FAIL  $name ($flags): no counterexample (errors: ${errors:-?}, $states states):" \
            "the model does not catch this bug"
    fi
}

echo "spin model check of the claim floor: $model"
expect_verified default
expect_verified claims -DNC=0 -DNW=2 -DANY_START
expect_verified merge -DNCL=1 -DNW=2
expect_caught broken-raise -DNC=0 -DNW=2 -DANY_START -DBROKEN_RAISE
expect_caught broken-lower -DNC=0 -DNW=2 -DANY_START -DBROKEN_LOWER
expect_caught broken-gen -DBROKEN_GEN
expect_caught broken-ring-min -DNCL=1 -DNW=2 -DBROKEN_RING_MIN
expect_caught broken-proposal -DNC=0 -DNW=2 -DANY_START -DBROKEN_PROPOSAL
expect_caught broken-fresh -DNCL=1 -DNW=2 -DBROKEN_FRESH
expect_caught reach-top -DREACH_TOP

if [ "$failed" != 0 ]; then
    echo "check.sh: FAILED (see FAIL above)"
    exit 1
fi
echo "check.sh: all as expected"
