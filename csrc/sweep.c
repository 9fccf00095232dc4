/* Rows in flight: taken out of the index at grant, put back when their lease ends.
 *
 * A pool always holds rows: every worker has a batch in hand for the seconds a render takes.
 * If a leased row kept its index entry, every claim pass would read it again (and, past a few
 * thousand of them, a lane's window would fill with nothing but rows in flight). So a grant
 * takes the row out: it sets FLIGHT in the row word (csrc/layout.h), notes its lease's expiry
 * in the shared lease_min word, and tombstones the index entry it came from (csrc/claim.c). No
 * pass reads it again until the lease ends, and whatever ends the lease puts it back through
 * the ring, in the order every write keeps (csrc/floor.c: key, ring + ring_min, floor lowered):
 *
 *   complete, fail   store a new row word (which clears FLIGHT), publish it       csrc/writes.c
 *   release          clear FLIGHT, publish the unchanged key, then free the lease  csrc/writes.c
 *   closing owner    the same for each lease it still holds                       csrc/lease.c
 *   expiry, death    the sweep below: nobody calls anything when a lease lapses
 *
 * So a FLIGHT row holds no floor: the floor may rise past it, and putting it back lowers the
 * floor again as any write does. The model of this protocol is tests/model/floor.pml.
 *
 * The sweep. lease_min ([sweeping:1][version:21][ms:42]) is a lower bound on the expiry of every
 * lease holding a FLIGHT row: grants and renewals lower it (rl_lease_min_note), marking an
 * owner dead sets it to 0. A pass that finds it due elects one sweeper (the `sweeper` word, as
 * the compactor word: a dead holder is taken over), which marks the word sweeping with its ms
 * field reset, walks the row table, puts back every FLIGHT row whose lease is claimable
 * (expired, or its owner dead) and takes the minimum expiry of the others; at the end it folds
 * that minimum into whatever notes arrived meanwhile, clearing the flag. A grant that read the
 * word before the sweep began set FLIGHT before that read, so the walk sees it; one that reads
 * it later lowers the collecting field; the final CAS moves the version, so none is lost. The
 * first pass after an expiry (the one that wins the election) therefore finds the lapsed row.
 *
 * Deaths are seen without a supervisor: every 100 ms (monotonic) one pass checks the owners
 * table (csrc/owners.c: the beacon, else kill(pid, 0)); a dead owner sets lease_min to 0, so the
 * next pass sweeps. A sweep reads the row table once and runs once per earliest expiry, not per
 * pass: a pool with 30 s leases sweeps about every 30 s, and a big table's sweeps are spaced
 * (SWEEP_SPACING).
 */
#define _GNU_SOURCE
#include <string.h>
#include <time.h>

#include "layout.h"

#define SWEEP_BATCH 256
/* A sweep of a table of SWEEP_SPACED_ROWS rows or more, or one that took longer than
 * SWEEP_SPACED_NS (in CPU time), keeps the next one off for SWEEP_SPACING times as long, so
 * leases that lapse one after another cannot keep the row table being read: at most a fifth of
 * the time goes to sweeps, and a lapsed row waits at most four sweeps' time (a few ms at 1.6M
 * rows). The row count is there because a sweep of 1.6M rows takes about 1 ms: under the time
 * rule alone, whenever one took a little less, every claim of a pool whose leases lapse
 * continually swept (bench_inflight's "steady": 724 us a claim in 8 rounds of 9). A small table
 * (every test) sweeps on every expiry, however loaded the machine. A sweep held off is not
 * skipped: it is paid, with the merge its put-back asks for, by the first claim after the
 * spacing, whichever that is (bench_inflight's "catchup", 10.3 ms at 1.6M rows
 * putting back about 12,000 lapsed rows, most of it the merge: bench/results/
 * inflight_trees_20261206_0ad22d8.json); every other claim costs what nothing in flight costs. */
#define SWEEP_SPACED_ROWS (1u << 18)
#define SWEEP_SPACED_NS 1000000LL /* 1 ms */
#define SWEEP_SPACING 4

static int64_t clock_ns(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static int sweep_rows(rl_seg *s, uint32_t owner, int64_t now, uint8_t *memo, int64_t *min_out) {
    uint32_t used = atomic_load(&s->h->rows_used);
    if (used > s->h->row_capacity) used = s->h->row_capacity;
    uint32_t rows[SWEEP_BATCH];
    uint64_t words[SWEEP_BATCH];
    uint32_t n = 0;
    int64_t least = (int64_t)RL_HORIZON;
    for (uint32_t r = 0; r < used; r++) {
        uint64_t word = atomic_load_explicit(&s->rows[r].word, memory_order_acquire);
        if (!(word & RL_WORD_FLIGHT)) continue;
        uint64_t w = atomic_load_explicit(&s->rows[r].lease, memory_order_acquire);
        if (!rl_lease_claimable(s, w, now, memo)) {
            if (RL_LEASE_EXPIRY(w) < least) least = RL_LEASE_EXPIRY(w);
            continue;
        }
        rows[n] = r;
        words[n++] = word;
        if (n == SWEEP_BATCH) {
            int rc = rl_flight_return(s, owner, n, rows, words, NULL);
            if (rc != RL_OK) return rc;
            n = 0;
        }
    }
    *min_out = least;
    return rl_flight_return(s, owner, n, rows, words, NULL);
}

static int sweeper_acquire(rl_seg *s, uint32_t owner, uint8_t *memo) {
    uint64_t cur = 0;
    if (atomic_compare_exchange_strong(&s->h->sweeper, &cur, owner)) return 1;
    if (cur == owner || rl_owner_alive(s, (uint32_t)cur, memo)) return 0;
    return atomic_compare_exchange_strong(&s->h->sweeper, &cur, owner); /* its holder died */
}

void rl_sweep_if_due(rl_seg *s, uint32_t owner, int64_t now) {
    uint64_t w = atomic_load(&s->h->lease_min);
    if (!(w & RL_LMIN_SWEEPING) && RL_LMIN_MS(w) > now) return; /* the common case: one load */
    if (clock_ns(CLOCK_MONOTONIC) < atomic_load_explicit(&s->h->sweep_after_ns, memory_order_relaxed))
        return;
    /* The spacing bounds the CPU sweeps take, so a sweep is timed in this thread's CPU time: a
     * sweep of a small table that was preempted (a loaded machine) is not a long sweep. */
    int64_t cpu0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    uint8_t memo[RL_MAX_OWNERS]; /* owner liveness, asked once per sweep */
    memset(memo, 0, sizeof memo);
    if (!sweeper_acquire(s, owner, memo)) return;
    for (;;) { /* mark it sweeping; a taken-over sweep keeps the notes collected so far */
        w = atomic_load(&s->h->lease_min);
        int sweeping = (w & RL_LMIN_SWEEPING) != 0;
        if (!sweeping && RL_LMIN_MS(w) > now) goto out; /* another sweep just ended */
        int64_t keep = sweeping ? RL_LMIN_MS(w) : (int64_t)RL_HORIZON;
        if (atomic_compare_exchange_weak(&s->h->lease_min, &w, RL_LMIN_NEXT(w, 1, keep))) break;
    }
    int64_t least = (int64_t)RL_HORIZON;
    /* A failed publish (out of memory for a merge) already asked for a repair, whose full
     * rebuild finds the rows it could not put back; the minimum then stays conservative. */
    if (sweep_rows(s, owner, now, memo, &least) != RL_OK) least = now;
    w = atomic_load(&s->h->lease_min);
    for (;;) {
        int64_t ms = RL_LMIN_MS(w) < least ? RL_LMIN_MS(w) : least;
        if (atomic_compare_exchange_weak(&s->h->lease_min, &w, RL_LMIN_NEXT(w, 0, ms))) break;
    }
    int64_t took = clock_ns(CLOCK_THREAD_CPUTIME_ID) - cpu0;
    int spaced = took > SWEEP_SPACED_NS || atomic_load(&s->h->rows_used) >= SWEEP_SPACED_ROWS;
    atomic_store(&s->h->sweep_after_ns,
                 spaced ? clock_ns(CLOCK_MONOTONIC) + SWEEP_SPACING * took : 0);
out:;
    uint64_t me = owner;
    atomic_compare_exchange_strong(&s->h->sweeper, &me, 0);
}

