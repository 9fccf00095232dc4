/* The index: sorted (key, row) arrays in the segment, a ring of recent writes, and the merge.
 *
 * The row table is the truth; the index is a hint. A claim pass accepts a candidate only when
 * the row's current key still equals the candidate's key and a CAS on its lease word succeeds,
 * so a stale or torn read of the index or the ring can only miss a row, never grant a wrong one.
 *
 * Two index generations live side by side. The merge (whoever wins the compactor word) writes
 * the inactive one from the live entries of the active one plus the published ring entries,
 * then publishes it with one store of index_gen, advances ring_head, and bumps every lane's
 * floor epoch; claim passes never wait for it. A pass still reading the old generation can only
 * miss rows that moved, and cannot raise a floor because the generation moved under it.
 *
 * Ring slots carry a state word, RL_SLOT(position, 1 published | 2 abandoned). A writer reserves
 * slots by CAS on ring_tail, fills them and publishes each by CAS from the state it found; the
 * merge abandons a slot that stays unpublished past a deadline (its writer was killed between
 * the two steps) by a CAS from the same state, and a writer that loses that race appends again.
 * Writers store the row's key before appending, so a row whose append is lost or abandoned is
 * still queued in the row table and comes back at the next full rebuild (rl_repair).
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "layout.h"

#define ABANDON_AFTER_NS 50000000LL /* 50 ms */
#define MERGE_AHEAD 32 /* index entries the merge prefetches rows ahead */

static int64_t mono_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

void rl_ring_min_note(rl_seg *s, uint64_t key) {
    _Atomic uint64_t *m = &s->lanes[rl_key_lane(key)].ring_min;
    uint64_t cur = atomic_load(m);
    while (!atomic_compare_exchange_weak(m, &cur, RL_RMIN_NEXT(cur, key < RL_RMIN_KEY(cur) ? key : RL_RMIN_KEY(cur))))
        ;
}


int rl_ring_append(rl_seg *s, uint32_t owner, uint32_t n, const uint64_t *keys,
                   const uint32_t *rows, uint32_t *advice) {
    uint64_t cap = s->h->ring_capacity;
    uint64_t lane_min[RL_MAX_LANES];
    if (n == 0) return RL_OK;
    if (n > cap) return RL_E_CAPACITY;
    for (uint32_t l = 0; l < RL_MAX_LANES; l++) lane_min[l] = RL_KEY_NONE;
    uint32_t done = 0;
    while (done < n) {
        uint32_t want = n - done;
        uint64_t tail = atomic_load(&s->h->ring_tail);
        uint64_t head = atomic_load(&s->h->ring_head);
        if (tail + want - head > cap) {
            int rc = rl_compact(s, owner, 0);
            if (rc == RL_E_BUSY) sched_yield();
            else if (rc != RL_OK) return rc;
            continue;
        }
        if (!atomic_compare_exchange_weak(&s->h->ring_tail, &tail, tail + want)) continue;
        for (uint32_t i = 0; i < want; i++) {
            uint64_t pos = tail + i;
            rl_ring_slot *slot = &s->ring[pos % cap];
            uint64_t key = keys[done + i];
            uint32_t old = atomic_load(&slot->state);
            int ok = 0;
            if (old != RL_SLOT(pos, 2)) { /* not abandoned under us (yet) */
                atomic_store_explicit(&slot->key, key, memory_order_relaxed);
                atomic_store_explicit(&slot->row, rows[done + i], memory_order_relaxed);
                ok = atomic_compare_exchange_strong(&slot->state, &old, RL_SLOT(pos, 1));
            }
            if (ok) {
                uint32_t l = rl_key_lane(key);
                if (key != RL_KEY_NONE && key < lane_min[l]) lane_min[l] = key; /* NONE: a removal */
            } else {
                /* The merge abandoned this slot while we were descheduled: append it again. */
                int rc = rl_ring_append(s, owner, 1, &keys[done + i], &rows[done + i], advice);
                if (rc != RL_OK) return rc;
            }
        }
        done += want;
    }
    for (uint32_t l = 0; l < RL_MAX_LANES; l++)
        if (lane_min[l] != RL_KEY_NONE) rl_ring_min_note(s, lane_min[l]);
    uint64_t used = atomic_load(&s->h->ring_tail) - atomic_load(&s->h->ring_head);
    /* Ask for a merge at three quarters full (it was half): a merge copies the whole index, so
     * part of its cost is O(index) whatever the ring holds, and merging a third less often took
     * ~12% off claim + complete at 1.6M rows. The last quarter (65k writes at 1.6M) is the room
     * writers keep while a merge runs; a writer that finds the ring full merges (or waits for
     * the merge) itself, as before. */
    if (advice && used * 4 > cap * 3 && !rl_merge_running(s)) *advice |= RL_ADVISE_COMPACT;
    return RL_OK;
}

/* ================================================================ tombstones ===== */

/* A claim pass tombstones the entries it took rows from (and stale or FLIGHT-held ones it
 * read), in place, so later passes skip them with no row read and the merge drops them.
 * The buffer of generation g is rewritten for g + 2; a tombstone CAS must not land in it then.
 * So the pass enters its owner's hazard for g (rl_hazard_enter, csrc/layout.h) and re-checks
 * the generation before any CAS, and the merge waits for live owners' hazards on the buffer it
 * is about to rewrite. A tombstone is a hint: one skipped (another thread of the owner marks in
 * another generation) only leaves an entry for a pass to read. */
void rl_index_tomb(rl_seg *s, uint32_t owner, uint64_t gen, uint32_t n, const uint32_t *poss,
                   const uint64_t *keys) {
    _Atomic uint64_t *hz = &s->owners[owner].hazard;
    if (n == 0 || !rl_hazard_enter(hz, gen)) return;
    if (atomic_load(&s->h->index_gen) == gen) {
        uint32_t b = gen & 1, count = atomic_load(&s->h->index_count[b]);
        for (uint32_t i = 0; i < n; i++) {
            if (poss[i] >= count) continue;
            uint64_t expect = keys[i];
            atomic_compare_exchange_strong(&s->ikeys[b][poss[i]], &expect, keys[i] | RL_TOMB);
        }
    }
    rl_hazard_leave(hz);
}

static void hazards_wait(rl_seg *s, uint64_t gen_of_buffer) {
    for (uint32_t o = 1; o < RL_MAX_OWNERS; o++) {
        while (rl_hazard_in(atomic_load(&s->owners[o].hazard), gen_of_buffer)) {
            if (!rl_owner_alive(s, o, NULL)) break;
            sched_yield();
        }
    }
}

/* ================================================================ compactor word ===== */

int rl_compactor_acquire(rl_seg *s, uint32_t owner) {
    for (;;) {
        uint64_t cur = 0;
        if (atomic_compare_exchange_strong(&s->h->compactor, &cur, owner)) return RL_OK;
        /* Held: by a live process, wait for it; by a dead one, take it over. */
        if (rl_owner_alive(s, (uint32_t)cur, NULL)) return RL_E_BUSY;
        if (atomic_compare_exchange_strong(&s->h->compactor, &cur, owner)) return RL_OK;
    }
}

void rl_compactor_release(rl_seg *s, uint32_t owner) {
    uint64_t cur = owner;
    atomic_compare_exchange_strong(&s->h->compactor, &cur, 0);
}

/* ================================================================ sorting ===== */

typedef struct {
    uint64_t key;
    uint32_t row;
    uint32_t pad;
} Entry;

static int Entry_Cmp(const void *a, const void *b) {
    const Entry *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return (x->row > y->row) - (x->row < y->row);
}

/* LSD radix sort on (key, row), 11-bit digits, one stable pass per digit. Keys are below 2^53
 * (five digits); rows below 2^31 (three). `rows_in_order`: the input is already in row order
 * (the full rebuild scans the row table), so the row passes are skipped. A digit every entry
 * shares (the lane bits, the high bits of nearby due times and row ids) costs only its count. */
static int Entry_RadixSort(Entry *a, size_t n, int rows_in_order) {
    if (n < 4096) {
        qsort(a, n, sizeof(Entry), Entry_Cmp);
        return RL_OK;
    }
    Entry *tmp = malloc(n * sizeof(Entry));
    if (!tmp) return RL_E_SYS;
    size_t count[2048];
    Entry *src = a, *dst = tmp;
    for (int pass = rows_in_order ? 3 : 0; pass < 8; pass++) {
        int on_row = pass < 3, shift = (on_row ? pass : pass - 3) * 11;
#define DIGIT(e) ((on_row ? (uint64_t)(e).row : (e).key) >> shift & 2047)
        memset(count, 0, sizeof count);
        for (size_t i = 0; i < n; i++) count[DIGIT(src[i])]++;
        if (count[DIGIT(src[0])] == n) continue; /* one digit value: order unchanged */
        size_t sum = 0;
        for (int d = 0; d < 2048; d++) {
            size_t c = count[d];
            count[d] = sum;
            sum += c;
        }
        for (size_t i = 0; i < n; i++) dst[count[DIGIT(src[i])]++] = src[i];
#undef DIGIT
        Entry *t = src;
        src = dst;
        dst = t;
    }
    if (src != a) memcpy(a, src, n * sizeof(Entry));
    free(tmp);
    return RL_OK;
}

/* ================================================================ the merge ===== */

/* Whether an entry must go into the new index: its row is still at that key, and not held in
 * flight (FLIGHT with a lease: whatever ends the lease puts it back, csrc/sweep.c). */
static int row_wanted(rl_seg *s, uint32_t row, uint64_t key, uint32_t used) {
    if (row >= used) return 0;
    uint64_t word = atomic_load_explicit(&s->rows[row].word, memory_order_acquire);
    if (RL_WORD_KEY(word) != key) return 0;
    return !(word & RL_WORD_FLIGHT) ||
           RL_LEASE_OWNER(atomic_load_explicit(&s->rows[row].lease, memory_order_acquire)) == 0;
}

/* One merge, phase by phase: settle the ring's prefix; merge it into the index (or rebuild the
 * index from the row table); find the lane starts; publish the new generation and reset what
 * describes the ring's remainder. */
typedef struct {
    rl_seg *s;
    uint64_t gen;        /* the active generation, which this merge replaces with gen + 1 */
    uint32_t src, dst;   /* its buffer, and the other one, written here */
    uint64_t head, upto; /* the ring positions taken in, [head, upto), every slot settled */
    uint32_t used;       /* rows_used, read after the ring settled (see Merge_Begin) */
    uint32_t count;      /* entries written to dst */
} Merge;

/* Whether the merge must re-read an index entry's row: only a row the ring moved (or removed)
 * since the last merge can have gone stale, since every write that changes a key appends it
 * to the ring after storing it (a write still in flight appends after the ring's settled
 * prefix, so the next merge sees it). `reread_all`: a slot was abandoned, its row unknown. */
#define MOVED(touched, reread_all, row, used) \
    ((reread_all) || (row) >= (used) || ((touched)[(row) >> 6] >> ((row) & 63) & 1))

/* Wait for the ring's published prefix; abandon a slot whose writer never finished. */
static uint64_t ring_settle(rl_seg *s, uint64_t head, uint64_t tail) {
    uint64_t cap = s->h->ring_capacity, pos = head;
    int64_t waited_from = 0;
    while (pos < tail) {
        rl_ring_slot *slot = &s->ring[pos % cap];
        uint32_t st = atomic_load(&slot->state);
        if (st == RL_SLOT(pos, 1) || st == RL_SLOT(pos, 2)) {
            pos++;
            waited_from = 0;
            continue;
        }
        int64_t now = mono_ns();
        if (!waited_from) waited_from = now;
        if (now - waited_from > ABANDON_AFTER_NS) {
            atomic_compare_exchange_strong(&slot->state, &st, RL_SLOT(pos, 2));
            continue; /* either we abandoned it or its writer just published it */
        }
        sched_yield();
    }
    return pos;
}

static void Merge_Begin(Merge *M, rl_seg *s) {
    rl_header *h = s->h;
    M->s = s;
    M->gen = atomic_load(&h->index_gen);
    M->src = M->gen & 1;
    M->dst = M->src ^ 1;
    M->head = atomic_load(&h->ring_head);
    M->upto = ring_settle(s, M->head, atomic_load(&h->ring_tail));
    /* After the ring settled: a row a settled slot names was reserved before its slot was, so it
     * is below `used` (read first, a row added meanwhile failed `row < used` and was dropped). */
    M->used = atomic_load(&h->rows_used);
    if (M->used > h->row_capacity) M->used = h->row_capacity;
    M->count = 0;
    if (M->gen > 0) hazards_wait(s, M->gen - 1); /* dst last held generation gen - 1 */
}

static void Merge_Put(Merge *M, uint64_t key, uint32_t row) {
    atomic_store_explicit(&M->s->ikeys[M->dst][M->count], key, memory_order_relaxed);
    atomic_store_explicit(&M->s->irows[M->dst][M->count], row, memory_order_relaxed);
    M->count++;
}

/* The active index's entries that are still wanted, merged with the ring's live entries, into
 * dst. Returns 1 when a full rebuild must be done instead (a row seen live at two keys while it
 * moved overflowed the buffer). */
static int Merge_Ring(Merge *M) {
    rl_seg *s = M->s;
    rl_header *h = s->h;
    uint32_t cap = h->row_capacity, used = M->used;
    uint64_t rcap = h->ring_capacity;
    size_t nr = 0;
    int reread_all = 0;
    Entry *fresh = malloc((size_t)(M->upto - M->head + 1) * sizeof(Entry));
    uint64_t *touched = calloc((size_t)used / 64 + 1, sizeof(uint64_t)); /* rows moved */
    if (!fresh || !touched) {
        free(fresh);
        free(touched);
        return RL_E_SYS;
    }
    /* slot indexes si (of pos) and sa (of pos + MERGE_AHEAD) wrap without a division each */
    uint64_t si = M->head % rcap, sa = (M->head + MERGE_AHEAD) % rcap;
    for (uint64_t pos = M->head; pos < M->upto;
         pos++, si = si + 1 == rcap ? 0 : si + 1, sa = sa + 1 == rcap ? 0 : sa + 1) {
        rl_ring_slot *slot = &s->ring[si];
        if (pos + MERGE_AHEAD < M->upto) { /* the liveness check below is a random row read */
            uint32_t ahead = atomic_load_explicit(&s->ring[sa].row, memory_order_relaxed);
            __builtin_prefetch(&s->rows[ahead < used ? ahead : 0]);
        }
        if (atomic_load(&slot->state) != RL_SLOT(pos, 1)) { /* abandoned */
            reread_all = 1;
            continue;
        }
        uint64_t key = atomic_load_explicit(&slot->key, memory_order_relaxed);
        uint32_t row = (uint32_t)atomic_load_explicit(&slot->row, memory_order_relaxed);
        if (row < used) touched[row >> 6] |= 1ULL << (row & 63);
        if (key != RL_KEY_NONE && row_wanted(s, row, key, used)) fresh[nr++] = (Entry){key, row, 0};
    }
    int rc = Entry_RadixSort(fresh, nr, 0);
    uint32_t nsrc = atomic_load(&h->index_count[M->src]);
    if (nsrc > cap) nsrc = cap;
    _Atomic uint64_t *sk = s->ikeys[M->src];
    _Atomic uint32_t *sr = s->irows[M->src];
    size_t i = 0, j = 0;
    uint64_t last_key = RL_KEY_NONE;
    uint32_t last_row = UINT32_MAX;
    while (rc == RL_OK && (i < nsrc || j < nr)) {
        Entry e;
        if (i + MERGE_AHEAD < nsrc) { /* the liveness check is a random row read: overlap the misses */
            uint32_t ahead = atomic_load_explicit(&sr[i + MERGE_AHEAD], memory_order_relaxed);
            if (ahead < used && MOVED(touched, reread_all, ahead, used)) __builtin_prefetch(&s->rows[ahead]);
        }
        uint64_t skey = i < nsrc ? atomic_load_explicit(&sk[i], memory_order_relaxed) : 0;
        uint32_t srow = i < nsrc ? atomic_load_explicit(&sr[i], memory_order_relaxed) : 0;
        if (i < nsrc && (skey & RL_TOMB)) { /* tombstone: dropped here */
            i++;
            continue;
        }
        if (j >= nr || (i < nsrc && (skey < fresh[j].key || (skey == fresh[j].key && srow <= fresh[j].row)))) {
            e.key = skey;
            e.row = srow;
            i++;
            if (MOVED(touched, reread_all, e.row, used) && !row_wanted(s, e.row, e.key, used))
                continue; /* stale or in flight: dropped here */
        } else {
            e = fresh[j++];
        }
        if (e.key == last_key && e.row == last_row) continue;
        if (M->count >= cap) { /* a row seen live at two keys while it moved: rebuild instead */
            rc = 1;
            break;
        }
        Merge_Put(M, e.key, e.row);
        last_key = e.key;
        last_row = e.row;
    }
    free(fresh);
    free(touched);
    return rc;
}

/* Every queued row of the table that is wanted, sorted, into dst; and each lane's lowest
 * minute, for rl_repair. */
static int Merge_Rebuild(Merge *M, uint32_t *lane_min) {
    rl_seg *s = M->s;
    Entry *entries = malloc((size_t)(M->used + 1) * sizeof(Entry));
    if (!entries) return RL_E_SYS;
    size_t n = 0;
    for (uint32_t r = 0; r < M->used; r++) {
        uint64_t key = rl_row_key(s, r);
        if (key == RL_KEY_NONE || !row_wanted(s, r, key, M->used)) continue;
        entries[n++] = (Entry){key, r, 0};
        if (lane_min) {
            uint32_t l = rl_key_lane(key), mi = rl_minute(rl_key_due(key));
            if (l < RL_MAX_LANES && mi < lane_min[l]) lane_min[l] = mi;
            if (l < RL_MAX_LANES) /* a repair: a dead writer's unpublished rows are indexed too */
                rl_lane_iv_note(s, l, atomic_load_explicit(&s->intervals[r], memory_order_relaxed), 0);
        }
    }
    int rc = Entry_RadixSort(entries, n, 1);
    M->count = 0;
    for (size_t i = 0; rc == RL_OK && i < n; i++) Merge_Put(M, entries[i].key, entries[i].row);
    free(entries);
    return rc;
}

/* Lane starts of the new generation: the first position of each lane, by binary search in the
 * sorted keys (a linear walk re-read the whole new index, ~2 ms at 1.6M entries). */
static void Merge_LaneStarts(Merge *M) {
    _Atomic uint64_t *dk = M->s->ikeys[M->dst];
    uint32_t p = 0;
    for (uint32_t l = 0; l <= RL_MAX_LANES; l++) {
        uint32_t hi = M->count;
        while (p < hi) {
            uint32_t mid = p + (hi - p) / 2;
            if (rl_key_lane(atomic_load_explicit(&dk[mid], memory_order_relaxed)) < l) p = mid + 1;
            else hi = mid;
        }
        atomic_store_explicit(&M->s->h->lane_start[M->dst][l], p, memory_order_relaxed);
    }
}

/* Publish the new generation, and reset what describes the ring to its remainder: ring_min
 * from the slots left (a CAS on each lane's versioned word read before the tail, so a write
 * that noted anything after that read keeps its lower or equal, still conservative, value) and
 * the lanes' ring hints (csrc/claim.c). Then every floor's epoch moves. */
static void Merge_Publish(Merge *M) {
    rl_seg *s = M->s;
    rl_header *h = s->h;
    uint64_t rcap = h->ring_capacity;
    atomic_store(&h->index_count[M->dst], M->count);
    uint64_t old_min[RL_MAX_LANES], new_min[RL_MAX_LANES];
    for (uint32_t l = 0; l < RL_MAX_LANES; l++) {
        old_min[l] = atomic_load(&s->lanes[l].ring_min);
        /* The ring hints of the new generation start empty; a pass of the old one that lowers
         * ring_low after this only makes its lane's hint more cautious (csrc/claim.c). */
        atomic_store(&s->lanes[l].ring_low, RL_KEY_NONE);
    }
    atomic_store(&h->index_gen, M->gen + 1); /* publish */
    atomic_store(&h->ring_head, M->upto);
    for (uint32_t l = 0; l < RL_MAX_LANES; l++) new_min[l] = RL_KEY_NONE;
    uint64_t tail_now = atomic_load(&h->ring_tail);
    for (uint64_t pos = M->upto; pos < tail_now; pos++) {
        rl_ring_slot *slot = &s->ring[pos % rcap];
        uint32_t st = atomic_load(&slot->state);
        if (st == RL_SLOT(pos, 2)) continue;
        uint64_t key = atomic_load_explicit(&slot->key, memory_order_relaxed);
        if (st != RL_SLOT(pos, 1)) { /* still being written: keep every lane conservative */
            for (uint32_t l = 0; l < RL_MAX_LANES; l++) new_min[l] = RL_RMIN_KEY(old_min[l]);
            break;
        }
        uint32_t l = rl_key_lane(key);
        if (l < RL_MAX_LANES && key < new_min[l]) new_min[l] = key;
    }
    for (uint32_t l = 0; l < RL_MAX_LANES; l++) {
        uint64_t expect = old_min[l];
        if (new_min[l] != RL_RMIN_KEY(old_min[l]))
            atomic_compare_exchange_strong(&s->lanes[l].ring_min, &expect,
                                           RL_RMIN_NEXT(old_min[l], new_min[l]));
    }
    rl_floor_bump_all(s);
}

int rl_compact_locked(rl_seg *s, int full, uint32_t *lane_min) {
    Merge M;
    Merge_Begin(&M, s);
    if (lane_min)
        for (uint32_t l = 0; l < RL_MAX_LANES; l++) lane_min[l] = UINT32_MAX;
    int rc = full ? 1 : Merge_Ring(&M);
    if (rc == 1) rc = Merge_Rebuild(&M, lane_min);
    if (rc != RL_OK) return rc;
    Merge_LaneStarts(&M);
    Merge_Publish(&M);
    return RL_OK;
}

int rl_compact(rl_seg *s, uint32_t owner, int full_rebuild) {
    int rc = rl_compactor_acquire(s, owner);
    if (rc != RL_OK) return rc;
    rc = rl_compact_locked(s, full_rebuild, NULL);
    rl_compactor_release(s, owner);
    return rc;
}
