#!/bin/sh
# Model-check the per-lane claim-floor protocol and the rows-in-flight protocol (tests/model/
# floor.pml; csrc/floor.c, csrc/claim.c, csrc/sweep.c, csrc/writes.c, csrc/index.c), the add
# path's reservation with the repair that rolls a dead writer's add forward or back
# (tests/model/add.pml; csrc/writes.c, csrc/lease.c, csrc/stats.c), and the interval classes
# of row words (tests/model/ivclass.pml; csrc/layout.h, csrc/writes.c, csrc/claim.c), with spin.
#
#   sh tests/model/check.sh
#
# 1. Exhaustive searches of the model, each of which must end with "errors: 0" over a nonzero
#    number of states, searched to the end (no depth or memory bound reached):
#      default            one write, two claimers, a compactor (no leases)
#      claims             two writes, two claimers, no compactor, any starting row table
#      merge              two writes, one claimer, a compactor
#      passes             one write, one claimer making three passes, a compactor
#      leases             two claimers that grant and end leases, the sweeper, the clock
#      lease-merge        one claimer that grants, a compactor, the sweeper, the clock
#      lease-write        a write, one claimer that grants, the sweeper, the clock
#      lease-write-merge  a write, one claimer that grants, a compactor (no clock, no sweep)
#      grow               a row added (rows_used grows), one claimer making two passes, a
#                         compactor; grow-writes: an add and a write; grow-leases: an add, one
#                         claimer that grants, a compactor
#      relapse            one row; one claimer making two passes (a lease lapses, the row is
#                         granted again), a compactor, the sweeper, the clock
#      stale-grant        one row; two claimers granting from the index and releasing (or
#                         letting lapse), a compactor, the sweeper, the clock
#      add                (add.pml) two writers adding two rows each, any of them killed at
#                         any step, a repair at any moment, then the last repair
#      add-twice          (add.pml) two writers adding one row twice each, two repairs
#      ivclass            (ivclass.pml) two writers filling one lane's interval table, a move
#                         to another lane, a claim pass weighing rows at any moment
# 2. Deliberately broken variants, in which spin must find an assertion violation (so the
#    property provably catches each bug), each with its counterexample printed step by step:
#    BROKEN_RAISE, BROKEN_LOWER, BROKEN_GEN, BROKEN_RING_MIN, BROKEN_PROPOSAL, BROKEN_FRESH
#    (the floor protocol); BROKEN_HINT (the skip hint used whatever the floor did since: the C
#    before the fix this model found); BROKEN_USED_FIRST (a pass reading rows_used before
#    the index generation: the C before the fix this model confirmed); BROKEN_RELEASE, BROKEN_REPUBLISH, BROKEN_SWEEP_MIN,
#    BROKEN_FLIGHT_ORDER, BROKEN_NOTE_ORDER (rows in flight); RELEASE_PUBLISH_FIRST,
#    SWEEP_PUBLISH_FIRST and NO_END_RECHECK (the rows-in-flight protocol as first written,
#    before the fixes this model found); and a sanity run, REACH_TOP, whose violation shows
#    that the floor does get raised to the top minute. In add.pml: NO_SETTLE (the repair before
#    the write journal: rows counted but empty), JOURNAL_AFTER, SETTLE_IGNORES_LIVE,
#    DROP_BEFORE_PUBLISH and SETTLE_JOURNALS_FIRST. In ivclass.pml: BROKEN_STORE, BROKEN_KEEP_CLASS,
#    BROKEN_WORD_FIRST, and the sanity run REACH_FULL (a lane's table found full).
#
# The searches run CHECK_JOBS at a time (default 2); their results are printed in the order
# above. SPIN_DEFINES is added to every run (e.g. SPIN_DEFINES=-DLITERAL_CAS_LOOPS). Work
# happens in a temporary directory that is removed on exit: nothing is left in the repository.
# Exit status: 0 all as expected, 1 a search did not end as expected, 2 spin or a compiler is
# missing, or the model does not build.
set -u

here=$(CDPATH='' cd -- "$(dirname -- "$0")" && pwd) || exit 2
model="$here/floor.pml"
CC=${CC:-gcc}
jobs=${CHECK_JOBS:-2}
case $jobs in '' | *[!0-9]* | 0) jobs=1 ;; esac

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
pids=
cleanup() { # the jobs still running, and the verifiers they started
    for p in $pids; do kill "$p" 2>/dev/null; done
    for f in "$work"/*/pan.pid; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

extra=${SPIN_DEFINES:-}
failed=0
started=$(date +%s)

# search NAME [-DNAME...]: generate, build and run the verifier in $work/NAME; sets $dir,
# $errors, $states and $complete (1 when the search reached its end).
search() {
    name=$1
    shift
    dir="$work/$name"
    case $name in add*) source="$here/add.pml" ;; ivclass*) source="$here/ivclass.pml" ;;
        *) source="$model" ;; esac
    mkdir "$dir" && cp "$source" "$dir/model.pml" || exit 2
    # shellcheck disable=SC2086  # $extra is a list of words
    if ! (cd "$dir" && spin -a "$@" $extra model.pml >spin.log 2>&1); then
        echo "check.sh: spin -a $* $extra $(basename "$source") failed:" >&2
        cat "$dir/spin.log" >&2
        exit 2
    fi
    # COLLAPSE: the state vectors compressed, a third of the memory for a tenth more time. -O1:
    # most searches take less time than building their verifier, which -O1 halves (the whole
    # check: 88-89 s, 102 s at -O2; a 21 s search 6 % slower)
    if ! (cd "$dir" && "$CC" -O1 -w -DSAFETY -DCOLLAPSE -DMEMLIM=4096 -o pan pan.c >cc.log 2>&1); then
        echo "check.sh: building the verifier ($*) failed:" >&2
        cat "$dir/cc.log" >&2
        exit 2
    fi
    (cd "$dir" && exec ./pan -m10000 >pan.log 2>&1) &
    echo $! >"$dir/pan.pid"
    wait $!
    rm -f "$dir/pan.pid"
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
    (cd "$dir" && spin -t "$@" $extra model.pml 2>&1) |
        sed -n -e 's/^ *MSC: /      /p' -e 's/^spin: text of failed assertion: /      violated: /p'
}

expect_verified() {
    name=$1
    shift
    search "$name" "$@"
    if [ "$errors" = 0 ] && [ "$states" != 0 ] && [ "$complete" = 1 ]; then
        echo "ok    $name ($flags): errors: 0, $states states, ${elapsed} s"
    else
        echo "FAIL  $name ($flags): errors: ${errors:-?}, $states states, ${elapsed} s" \
            "(complete: $complete)"
        grep -e '^pan:[0-9]*:' -e 'too small' -e 'MEMLIM' -e 'out of memory' "$dir/pan.log" |
            sed 's/^/      /'
        if [ -f "$dir/model.pml.trail" ]; then
            echo "      counterexample:"
            trail "$@"
        fi
        return 1
    fi
}

expect_caught() {
    name=$1
    shift
    search "$name" "$@"
    if [ "${errors:-0}" != 0 ] && grep -q 'assertion violated' "$dir/pan.log" &&
        [ -f "$dir/model.pml.trail" ]; then
        depth=$(sed -n 's/.*assertion violated.*(at depth \([0-9]*\)).*/\1/p' "$dir/pan.log")
        echo "ok    $name ($flags): caught, errors: $errors, at depth $depth, after $states states," \
            "${elapsed} s:"
        trail "$@"
    else
        echo "FAIL  $name ($flags): no counterexample (errors: ${errors:-?}, $states states):" \
            "the model does not catch this bug"
        return 1
    fi
}

# The job pool: job i runs in the background, writes its report to $work/job.i.out and its
# exit status to $work/job.i.rc; reports are printed in job order as soon as they are done.
njobs=0
printed=0
nap() { sleep 0.2 2>/dev/null || sleep 1; }
flush() {
    while [ "$printed" -lt "$njobs" ] && [ -f "$work/job.$((printed + 1)).rc" ]; do
        printed=$((printed + 1))
        cat "$work/job.$printed.out"
        rc=$(cat "$work/job.$printed.rc")
        if [ "$rc" = 2 ]; then exit 2; fi
        if [ "$rc" != 0 ]; then failed=1; fi
    done
}
running() {
    k=0
    i=$((printed + 1))
    while [ "$i" -le "$njobs" ]; do
        [ -f "$work/job.$i.rc" ] || k=$((k + 1))
        i=$((i + 1))
    done
    echo "$k"
}
# verified|caught NAME [-DNAME...]
job() {
    kind=$1
    shift
    flush
    while [ "$(running)" -ge "$jobs" ]; do
        nap
        flush
    done
    njobs=$((njobs + 1))
    (
        out="$work/job.$njobs"
        if [ "$kind" = verified ]; then
            expect_verified "$@" >"$out.out" 2>&1
        else
            expect_caught "$@" >"$out.out" 2>&1
        fi
        echo $? >"$out.tmp" && mv "$out.tmp" "$out.rc"
    ) &
    pids="$pids $!"
}

echo "spin model check of the claim floor, rows in flight and the add path: $here"
# the longest first, so that two run side by side to the end
job verified stale-grant -DLEASES -DNW=0 -DNCL=2 -DNC=1 -DNR=1 -DRING_GRANTS=0 -DENDS=2
job verified relapse -DLEASES -DNW=0 -DNCL=1 -DNPASS=2 -DNC=1 -DNR=1
job caught no-end-recheck -DLEASES -DNW=0 -DNCL=2 -DNC=1 -DNR=1 -DRING_GRANTS=0 -DENDS=2 -DNO_END_RECHECK
job verified leases -DLEASES -DNW=0 -DNCL=2 -DNC=0
job verified default
job verified claims -DNC=0 -DNW=2 -DANY_START
job verified merge -DNCL=1 -DNW=2
job verified passes -DNCL=1 -DNPASS=3
job verified lease-merge -DLEASES -DNW=0 -DNCL=1 -DNC=1
job verified lease-write -DLEASES -DNW=1 -DNCL=1 -DNC=0
job verified lease-write-merge -DLEASES -DNW=1 -DNCL=1 -DNC=1 -DNT=1 -DNSW=0
job verified grow -DADDS -DNCL=1 -DNPASS=2
job verified grow-writes -DADDS -DNCL=1 -DNW=2
job verified grow-leases -DADDS -DLEASES -DNW=1 -DNCL=1 -DNC=1 -DNT=1 -DNSW=0
job caught broken-raise -DNC=0 -DNW=2 -DANY_START -DBROKEN_RAISE
job caught broken-lower -DNC=0 -DNW=2 -DANY_START -DBROKEN_LOWER
job caught broken-gen -DBROKEN_GEN
job caught broken-ring-min -DNCL=1 -DNW=2 -DBROKEN_RING_MIN
job caught broken-proposal -DNC=0 -DNW=2 -DANY_START -DBROKEN_PROPOSAL
job caught broken-fresh -DNCL=1 -DNW=2 -DBROKEN_FRESH
job caught reach-top -DREACH_TOP
job caught broken-hint -DNCL=1 -DNPASS=3 -DBROKEN_HINT
job caught broken-used-first -DADDS -DNCL=1 -DBROKEN_USED_FIRST
job caught broken-release -DLEASES -DNW=0 -DNCL=1 -DNC=1 -DBROKEN_RELEASE
job caught broken-republish -DLEASES -DNW=0 -DNCL=2 -DNC=0 -DNSW=0 -DNT=1 -DBROKEN_REPUBLISH
job caught broken-sweep-min -DLEASES -DNW=0 -DNCL=2 -DNC=0 -DBROKEN_SWEEP_MIN
job caught broken-flight-order -DLEASES -DNW=0 -DNCL=2 -DNC=0 -DNSW=0 -DNT=1 -DBROKEN_FLIGHT_ORDER
job caught broken-note-order -DLEASES -DNW=0 -DNCL=1 -DNC=1 -DBROKEN_NOTE_ORDER
job caught release-publish-first -DLEASES -DNW=0 -DNCL=1 -DNC=1 -DRELEASE_PUBLISH_FIRST
job caught sweep-publish-first -DLEASES -DNW=0 -DNCL=1 -DNC=1 -DSWEEP_PUBLISH_FIRST
job verified add
job verified add-twice -DNA=2 -DK=1 -DNRP=2
job caught add-no-settle -DNO_SETTLE
job caught add-journal-after -DJOURNAL_AFTER
job caught add-settle-ignores-live -DSETTLE_IGNORES_LIVE
job caught add-drop-before-publish -DDROP_BEFORE_PUBLISH
job caught add-settle-journals-first -DSETTLE_JOURNALS_FIRST
job verified ivclass
job caught ivclass-broken-store -DBROKEN_STORE
job caught ivclass-broken-keep-class -DBROKEN_KEEP_CLASS
job caught ivclass-broken-word-first -DBROKEN_WORD_FIRST
job caught ivclass-reach-full -DREACH_FULL
while [ "$printed" -lt "$njobs" ]; do
    nap
    flush
done

took=$(($(date +%s) - started))
if [ "$failed" != 0 ]; then
    echo "check.sh: FAILED (see FAIL above), $njobs searches, ${took} s"
    exit 1
fi
echo "check.sh: all as expected, $njobs searches, ${took} s"
