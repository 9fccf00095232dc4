/* Per-lane claim floors: the race they must survive, and the protocol that survives it.
 *
 * A lane's floor is the minute below which the lane has no live row, so a claim pass can seek
 * straight to encode(lane, floor * 60000) instead of re-reading stale entries. A floor may only
 * ever be wrong on the low side. The race: a writer puts a row at minute x >= floor while a
 * claimer, which scanned before the row was visible, is about to raise the floor above x. The
 * row would then sit below the floor, unseen by every later pass: stranded.
 *
 * The word: [minute:32][epoch:32], one 64-bit atomic on its own cache line.
 *
 * Writers (csrc/writes.c), in this order:
 *   1. store the row's key;
 *   2. append (key, row) to the recent-write ring and publish it, then note it in the lane's
 *      ring_min (a CAS that lowers the key if needed and always moves its version,
 *      csrc/layout.h, csrc/index.c);
 *   3. rl_floor_lower: CAS the whole word to [min(minute, x) or 0 if it was 0 : epoch + 1].
 *      The epoch moves on every write, lowered or not.
 * Claimers (csrc/claim.c), per lane:
 *   a. load the word W (seq_cst) before looking at the index or the ring;
 *   b. scan; propose the minute of the first live row seen (a row held in flight does not
 *      count: it was taken out at grant and is put back by a write when its lease ends,
 *      csrc/sweep.c), else of the last entry read; take the minimum with ring_min's minute;
 *   c. if the index generation moved since the pass began, give up; else CAS W -> [proposal :
 *      epoch(W)], only upward.
 * A write that lands after (a) bumps the epoch before (c) can succeed, so the CAS fails; a write
 * whose step 3 came before (a) had its ring entry and key visible to the scan and its ring_min
 * seen in (b). A compaction publishes a new generation (c fails) and bumps every epoch; its
 * reset of ring_min is a CAS on the versioned word, so it cannot uncover a write noted during it.
 * Starting a scan at the lane's skip hint instead of the floor changes nothing here as long as
 * the floor did not move below the one the hint was made under: entries before the hint are
 * stale, in flight, or below that floor, and a row that takes such a key again is in the ring
 * too. A write lowers the floor exactly when a row may now lie below the old one (in the index,
 * after a merge), so the hint carries the highest floor minute it was made under (skip_floor)
 * and a pass whose W is lower seeks instead (the spin model found the stranding without it).
 * Any change to this order is a change to the protocol: re-check every interleaving above.
 * The model of this protocol is tests/model/floor.pml (checked by spin in `make test`); change
 * them together.
 */
#include "layout.h"

void rl_floor_lower(rl_seg *s, uint32_t lane, uint32_t minute) {
    _Atomic uint64_t *f = &s->lanes[lane].floor;
    uint64_t w = atomic_load(f);
    for (;;) {
        uint32_t cur = RL_FLOOR_MINUTE(w);
        /* 0 already means unbounded: nothing is lower, and "lowering" must not raise it. */
        uint32_t next = (cur == 0 || cur <= minute) ? cur : minute;
        uint64_t nw = RL_FLOOR_MAKE(next, RL_FLOOR_EPOCH(w) + 1u);
        if (atomic_compare_exchange_weak(f, &w, nw)) return;
    }
}

int rl_floor_raise(rl_seg *s, uint32_t lane, uint64_t seen, uint32_t minute) {
    if (minute <= RL_FLOOR_MINUTE(seen)) return 0;
    uint64_t expect = seen;
    return atomic_compare_exchange_strong(&s->lanes[lane].floor, &expect,
                                          RL_FLOOR_MAKE(minute, RL_FLOOR_EPOCH(seen)));
}

void rl_floor_bump_all(rl_seg *s) {
    for (uint32_t l = 0; l < RL_MAX_LANES; l++) {
        _Atomic uint64_t *f = &s->lanes[l].floor;
        uint64_t w = atomic_load(f);
        while (!atomic_compare_exchange_weak(f, &w,
                                             RL_FLOOR_MAKE(RL_FLOOR_MINUTE(w), RL_FLOOR_EPOCH(w) + 1u)))
            ;
    }
}
