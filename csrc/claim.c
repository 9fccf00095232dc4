/* The claim pass: pick up to `budget` due rows across lanes, lease them, lock-free.
 *
 * Per lane, one one-sided seek: binary search for encode(lane, floor * 60000) and read forward
 * at most `window` entries, stopping at the first entry not yet due or of another lane; due
 * entries left past the window are counted (spilled) for a later pass. Entries whose key no
 * longer equals the row's key are stale: skipped and counted. Rows written since the last merge
 * are read from the ring, but only for a lane whose ring_min says one of them is due. Lanes are
 * opened lazily, in the order the policy asks for them, so a pass touches only the lanes it
 * grants from (and the first candidate of each share class).
 *
 * Who gets served (policy, applied here and stated in Python as engine.policy.reference_pass):
 *   1. every share class with a claimable row accrues share * budget credit, capped at that
 *      plus one grant: a class with nothing due banks nothing;
 *   2. urgent takes at most its credit (a cap on drain share, not on admission);
 *   3. each min_share class, in lane order, takes up to its credit (a floor);
 *   4. the rest goes in lane order, by global due time (remainder = edf), or one grant at a
 *      time to the lane whose head is latest relative to its interval, times the lane's weight
 *      (remainder = lateness); what a floor class gets from it counts against its credit.
 * Credits are shared words (one cache line each), so shares hold over time across every worker
 * and every budget: 100 calls of budget 1 with only urgent rows due grant about 20.
 */
#define _GNU_SOURCE
#include <math.h>
#include <string.h>

#include "layout.h"

#define RING_CANDS 64
#define NOTE_BATCH 64 /* entries tombstoned per rl_index_tomb call */
/* Index entries are in key order, their rows in no order: each candidate is a cache (and TLB)
 * miss in the row table. Prefetching the rows ahead overlaps those misses, but in batches: a
 * grant's CAS cannot run before the prefetches issued ahead of it have left the pipeline, so one
 * prefetch per grant made every grant wait a full miss; refilling PREFETCH_AHEAD entries at a
 * time once fewer than PREFETCH_LOW are ahead makes a batch of grants wait for one (measured:
 * 0.74x the bare pass against one-per-grant at 8 ahead; 32/8 and 16/8 were no better). */
#define PREFETCH_AHEAD 16
#define PREFETCH_LOW 4
/* Entries that are stale or held in flight do not use up the window, and the pass tombstones
 * them, so the next pass crosses them in one jump: a lane never stalls behind rows in flight,
 * however many (a cap on them would let a lane holding that many rows in flight grant nothing).
 * A pass that reads more stale entries than `window` asks for a merge, which drops them. */
/* The most index entries a pass steps over after losing a row to another claimer (lane_take_one). */
#define JUMP_MAX 64
#define RING_SCAN_ADVISE 1024

/* Bench-only variants of the seek, for bench/bench_constraints.py, which builds its own module
 * from these sources with -DRL_BENCH and picks a variant at run time through rl_bench_flags.
 * The product build never defines RL_BENCH, so there every BENCH(...) is the constant 0. */
#ifdef RL_BENCH
extern int rl_bench_flags;
#define RL_BENCH_UNFLOORED 1 /* seek from the lane's base instead of its floor */
#define RL_BENCH_NO_SKIP 2   /* ignore the skip hint */
#define RL_BENCH_TWO_SIDED 4 /* also binary-search the upper bound, encode(lane, now) */
#define RL_BENCH_NO_TOMB 8   /* remember no claim positions, so completions leave no tombstones */
#define BENCH(flag) (rl_bench_flags & (flag))
#else
#define BENCH(flag) 0
#endif

/* A candidate's `pos`: its index position, or CAND_RING | its ring position's offset from
 * where the lane's ring scan began (positions and ring spans are below 2^31). */
#define CAND_RING (1u << 31)
/* One candidate row of a lane, from the index or the ring. */
typedef struct {
    uint64_t key; /* the entry's key (the row is granted only if its key still equals it) */
    uint32_t row; /* the row id the entry names */
    uint32_t pos; /* index position, or CAND_RING | ring offset (see CAND_RING) */
} Cand;

/* A lane's head as a lateness pass left it (see head_memo). */
typedef struct {
    uint64_t serial, gen; /* the handle and the index generation it was read in */
    uint64_t key;         /* the head's key */
    uint32_t row;         /* the head's row */
} HeadMemo;

/* One lane's scan within one pass: where it reads, what it has seen, what it will write back
 * (counters, the floor proposal, the skip and ring hints) when the pass ends. Kept per thread
 * and per lane (tls_cursors) and reset when a pass first opens the lane (lane_open). */
typedef struct {
    uint64_t stamp;        /* pass id that opened it: another value means not opened this pass */
    uint32_t lane;         /* the lane scanned */
    int idx_done;          /* the index scan ended (window, not-yet-due entry, next lane) */
    int ring_overflow;     /* more due ring rows than RING_CANDS: some were dropped */
    int done;              /* nothing more to grant from this lane in this pass */
    uint64_t floor_word;   /* W: the floor word, read before the index and the ring (floor.c) */
    uint64_t ring_min;     /* the lane's ring_min key, read after W */
    uint64_t due_limit;    /* encode(lane, now): entries above it are not yet due */
    uint32_t pos;          /* next index position to read */
    uint32_t end;          /* index position the scan stops at: the window, moved on past
                            * entries that use no window (tombstones, stale, in flight) */
    uint32_t pf;           /* rows of entries [.., pf) have been prefetched */
    uint32_t ahead;        /* how far ahead to prefetch: a peek needs few, a take its want */
    int iv_pf;             /* prefetch the rows' intervals too: a lateness pass may read a
                            * head's (head_interval), the lane holding more than one and its
                            * interval table full (a row may have no class) */
    uint32_t start;        /* index position the scan began at */
    uint32_t stale_run;    /* entries [start, stale_run) were all stale, tombstones or in flight:
                            * the next skip hint */
    int sought;            /* the scan began at a seek, not at the skip hint (which a floor
                            * lowered under it voids): its stale prefix's tombstones are marked */
    uint64_t first_live;   /* key of the first live entry seen (not in flight), or RL_KEY_NONE */
    uint64_t last_key;     /* key of the last entry of this lane read */
    int have_idx;          /* idx holds the next live index candidate */
    Cand idx;              /* that candidate */
    uint32_t rn;           /* ring candidates collected (ring[0..rn), sorted by key, row) */
    uint32_t ri;           /* ring candidates consumed: ring[ri..rn) are still to offer */
    int ring_read;         /* the ring was scanned for this lane (its hint is moved at the end) */
    uint64_t ring_skip;    /* the lane's ring hint as read before the scan */
    uint64_t ring_from;    /* first ring position scanned */
    uint64_t ring_to;      /* ring tail when scanned: positions [ring_from, ring_to) were read */
    uint64_t ring_block;   /* first position the hint may not pass (ring_to: none) */
    uint64_t ring_nd_min;  /* lowest key of this lane not yet due among those scanned */
    int have_peek;         /* peek holds a candidate already checked claimable */
    Cand peek;             /* that candidate (lane_peek), taken by lane_take_one */
    uint64_t peek_word;    /* its lease word when checked: the expected value of the lease CAS */
    HeadMemo memo;         /* this thread's last lateness pass's head (lane_open leaves it),
                            * beside the peek it is noted from */
    uint32_t granted;      /* rows granted from this lane (added to the lane's counter) */
    uint32_t spilled;      /* due entries of the lane past the window, left unread */
    uint32_t stale;        /* entries skipped: stale, tombstones, in flight, moved under a grant */
    uint32_t refused;      /* candidates whose lease could not be taken (held, or a lost race) */
    uint32_t tombs;        /* tombstones crossed (part of stale: they ask for no merge) */
    Cand ring[RING_CANDS]; /* last: a pass that reads no ring entry touches only the lines above */
} Cursor;

/* One claim pass: its arguments, the index generation it reads, its results, and what it has
 * yet to write back (tombstones, counters). On the stack of rl_claim. */
typedef struct {
    rl_seg *s;                        /* the segment */
    uint32_t owner;                   /* the claiming owner: leases are taken in its name */
    int64_t now;                      /* the pass's time (ms), wall clock or virtual */
    int64_t lease_ms;                 /* lease length given to each grant */
    uint32_t window;                  /* live index entries a lane's scan may read */
    uint32_t used;                    /* rows_used: row ids at or past it are torn reads */
    uint64_t gen;                     /* index generation read at the start (P.gen, floor.c) */
    uint64_t stamp;                   /* this pass's id (see Cursor.stamp) */
    uint32_t count;                   /* entries in this generation's index */
    const _Atomic uint64_t *ik;       /* this generation's keys */
    const _Atomic uint32_t *ir;       /* and rows */
    const _Atomic uint32_t *lane_start; /* and the first position of each lane */
    const rl_policy *p;               /* the policy in force (cached per thread) */
    Cursor *cursors;                  /* this thread's tls_cursors, found once per pass */
    int late;                         /* the remainder weighs heads (remainder_lateness) */
    int unit;                         /* ... each lane weighing 1, each interval 1 s: edf */
    uint32_t lanes;                   /* lanes to consider: up to the highest ever written */
    uint32_t n;                       /* rows granted so far */
    uint32_t budget;                  /* rows asked for */
    int64_t *out_rows, *out_lanes, *out_due, *out_tokens; /* the caller's result columns */
    uint32_t advice;                  /* RL_ADVISE_* for the caller */
    Cursor *opened[RL_MAX_LANES];     /* the lanes opened, in the order they were */
    uint32_t nopened;                 /* how many */
    uint32_t nnotes;                  /* entries to tombstone, not yet handed to rl_index_tomb */
    uint64_t reads;                   /* index entries read (a step over a jump reads one) */
    uint32_t note_pos[NOTE_BATCH];    /* their positions */
    uint64_t note_key[NOTE_BATCH];    /* and the keys they hold (the CAS's expected value) */
    int granted_any;                  /* a row was granted: lease_min must hear of it */
    int lease_noted;                  /* it has (before the first tombstone, csrc/sweep.c) */
    uint32_t cls_granted[RL_CLASSES]; /* grants per share class, for the credit accounting */
} Pass;

/* Per thread, so a pass allocates nothing: cursors, the owner-liveness memo, the policy cache. */
static __thread Cursor tls_cursors[RL_MAX_LANES];
static __thread uint64_t tls_stamp;
static __thread uint64_t tls_reads; /* index entries this thread's passes read: rl_index_reads */
static __thread uint8_t tls_memo[RL_MAX_OWNERS];
/* The owners whose memo entry this pass set, so the next pass clears those bytes, not all 1024
 * (MEMO_TOUCHED + 1: too many, clear everything). */
#define MEMO_TOUCHED 16
static __thread uint16_t tls_memo_touched[MEMO_TOUCHED];
static __thread uint32_t tls_memo_n = MEMO_TOUCHED + 1;

/* Keep the row-table reads of the entries ahead of the cursor in flight (see PREFETCH_AHEAD).
 * A tombstone needs no row read (its row field may hold a jump), and after a jump over a run of
 * them the window ahead is refilled at once: every pass starts on the previous pass's grants,
 * now tombstones, and without the refill the first live rows after them were read cold. A row id
 * past the used rows (a torn read) is clamped rather than divided down. */
static inline void rows_prefetch(const Pass *P, Cursor *c) {
    if (c->pf > c->pos + PREFETCH_LOW) return;
    uint32_t k = c->pf > c->pos ? c->pf : c->pos;
    uint32_t stop = c->pos + c->ahead < c->end ? c->pos + c->ahead : c->end;
    for (; k < stop; k++) {
        if (atomic_load_explicit(&P->ik[k], memory_order_relaxed) & RL_TOMB) continue;
        uint32_t r = atomic_load_explicit(&P->ir[k], memory_order_relaxed);
        rl_prefetch_w(&P->s->rows[r < P->used ? r : 0]); /* a grant CASes its lease */
        if (c->iv_pf)
            __builtin_prefetch(&P->s->intervals[r < P->used ? r : 0], 0, 3);
    }
    c->pf = k;
}

/* rl_lease_claimable with the pass's owner-liveness memo; a free or expired lease needs none. */
static int lease_claimable(const Pass *P, uint64_t w) {
    uint32_t o = RL_LEASE_OWNER(w);
    if (o == 0 || RL_LEASE_EXPIRY(w) <= P->now) return 1;
    if (!tls_memo[o]) {
        if (tls_memo_n < MEMO_TOUCHED) tls_memo_touched[tls_memo_n++] = (uint16_t)o;
        else tls_memo_n = MEMO_TOUCHED + 1;
    }
    return rl_lease_claimable(P->s, w, P->now, tls_memo);
}

static void memo_reset(void) {
    if (tls_memo_n > MEMO_TOUCHED) memset(tls_memo, 0, sizeof tls_memo);
    else
        for (uint32_t i = 0; i < tls_memo_n; i++) tls_memo[tls_memo_touched[i]] = 0;
    tls_memo_n = 0;
}

/* Whether a row read by the scan is held in flight: taken out at grant (FLIGHT) and its lease
 * still held, so whatever ends the lease puts it back (csrc/sweep.c) and no pass needs it. */
static int held_in_flight(const Pass *P, uint32_t row, uint64_t word) {
    return (word & RL_WORD_FLIGHT) &&
           !lease_claimable(P, atomic_load_explicit(&P->s->rows[row].lease, memory_order_acquire));
}

/* rows_used, clamped to the table. A pass reads it after index_gen: the merge read it before
 * publishing the generation, so every row the index names is below it. Read first, a row added
 * and merged meanwhile read as not queued: the skip hint moved past it and the floor could
 * rise over it, until the next merge (tests/model/floor.pml -DBROKEN_USED_FIRST). */
static uint32_t used_now(rl_seg *s) {
    uint32_t used = atomic_load(&s->h->rows_used);
    return used > s->h->row_capacity ? s->h->row_capacity : used;
}

/* Keep the RING_CANDS smallest due ring entries of a lane, sorted. The scan starts at the lane's
 * ring hint while nothing it stepped over can have fallen due (ring_low), and notes where the
 * hint may move to: up to the first entry a later pass must still read (csrc/layout.h). A
 * published slot names a row added before it was published, perhaps after the pass read
 * P.used: P.used is read again then, since skipping the row would move the hint past it. */
static void ring_collect(Pass *P, Cursor *c) {
    rl_seg *s = P->s;
    rl_lane *ln = &s->lanes[c->lane];
    uint64_t cap = s->h->ring_capacity;
    c->ring_skip = atomic_load(&ln->ring_skip);
    uint64_t head = atomic_load(&s->h->ring_head);
    uint64_t tail = atomic_load(&s->h->ring_tail);
    uint64_t from = head;
    if ((uint32_t)(c->ring_skip >> 32) == (uint32_t)P->gen && atomic_load(&ln->ring_low) > c->due_limit) {
        uint64_t at = tail - (uint32_t)((uint32_t)tail - (uint32_t)c->ring_skip);
        if (at > from && at <= tail) from = at;
    }
    c->ring_read = 1;
    c->ring_from = from;
    c->ring_to = c->ring_block = tail;
    c->ring_nd_min = RL_KEY_NONE;
    if (tail - from > RING_SCAN_ADVISE) P->advice |= RL_ADVISE_COMPACT;
    for (uint64_t pos = from; pos < tail; pos++) {
        rl_ring_slot *slot = &s->ring[pos % cap];
        uint32_t st = atomic_load_explicit(&slot->state, memory_order_acquire);
        if (st != RL_SLOT(pos, 1)) {
            if (st != RL_SLOT(pos, 2) && pos < c->ring_block) c->ring_block = pos; /* unwritten */
            continue;
        }
        uint64_t key = atomic_load_explicit(&slot->key, memory_order_relaxed);
        uint32_t row = (uint32_t)atomic_load_explicit(&slot->row, memory_order_relaxed);
        if (atomic_load_explicit(&slot->state, memory_order_acquire) != st) { /* reused */
            if (pos < c->ring_block) c->ring_block = pos;
            continue;
        }
        if (key == RL_KEY_NONE || rl_key_lane(key) != c->lane) continue;
        if (row >= P->used) P->used = used_now(s); /* added during this pass */
        if (row >= P->used) { /* a torn read: no hint past it */
            if (pos < c->ring_block) c->ring_block = pos;
            continue;
        }
        uint64_t word = atomic_load_explicit(&s->rows[row].word, memory_order_acquire);
        if (RL_WORD_KEY(word) != key) continue; /* stale */
        if (key > c->due_limit) {
            if (key < c->ring_nd_min) c->ring_nd_min = key;
            continue;
        }
        uint64_t w = atomic_load_explicit(&s->rows[row].lease, memory_order_acquire);
        if (!lease_claimable(P, w)) { /* in flight: holds no slot */
            if (!(word & RL_WORD_FLIGHT) && pos < c->ring_block) c->ring_block = pos; /* comes back here */
            continue;
        }
        uint32_t i = c->rn;
        while (i > 0 && (c->ring[i - 1].key > key || (c->ring[i - 1].key == key && c->ring[i - 1].row > row)))
            i--;
        if (i > 0 && c->ring[i - 1].key == key && c->ring[i - 1].row == row) continue; /* a copy */
        if (c->rn == RING_CANDS) {
            c->ring_overflow = 1;
            c->ring_block = c->ring_from; /* which were dropped is not known: no hint */
            P->advice |= RL_ADVISE_COMPACT; /* move them into the index, where the window reads them */
            if (i == RING_CANDS) continue; /* above every one kept */
            c->rn--; /* drop the largest */
        }
        memmove(&c->ring[i + 1], &c->ring[i], (c->rn - i) * sizeof(Cand));
        c->rn++;
        c->ring[i] = (Cand){key, row, CAND_RING | (uint32_t)(pos - from)};
    }
}

/* Due ring rows a pass read but left (a share took fewer than were due) are appended again
 * at the tail, up to this many, so the lane's ring hint can move past where they were instead of
 * stopping there while every later write piles up behind them. */
#define CARRY_MAX 8

/* After the pass: move the lane's ring hint past what this pass read and need not be read
 * again, first lowering ring_low to the lowest not-yet-due key stepped over, so a reader that
 * sees the new hint also sees that key. */
static void ring_hint_advance(Pass *P, Cursor *c) {
    rl_seg *s = P->s;
    rl_lane *ln = &s->lanes[c->lane];
    uint64_t to = c->ring_block, left_keys[CARRY_MAX + 1];
    uint32_t left_rows[CARRY_MAX + 1], nleft = 0;
    for (uint32_t i = c->ri; i <= c->rn; i++) { /* candidates not taken, and the one peeked */
        Cand *k = i < c->rn ? &c->ring[i] : (c->have_peek ? &c->peek : NULL);
        if (!k || !(k->pos & CAND_RING)) continue;
        uint64_t at = c->ring_from + (k->pos & ~CAND_RING);
        if (at < to) to = at;
        if (nleft <= CARRY_MAX) {
            left_keys[nleft] = k->key;
            left_rows[nleft++] = k->row;
        }
    }
    /* A ring append only: the floor is already at or below them (ring_min holds them since
     * their first append), and lowering it again would void the lane's skip hint. */
    if (nleft && nleft <= CARRY_MAX &&
        rl_ring_append(s, P->owner, nleft, left_keys, left_rows, &P->advice) == RL_OK)
        to = c->ring_block; /* they are after the scan now */
    if (to <= c->ring_from) return;
    uint64_t low = c->ring_nd_min;
    if (to < c->ring_to) { /* the lowest not-yet-due key before `to` only */
        uint64_t cap = s->h->ring_capacity;
        low = RL_KEY_NONE;
        for (uint64_t pos = c->ring_from; pos < to; pos++) {
            rl_ring_slot *slot = &s->ring[pos % cap];
            uint64_t key = atomic_load_explicit(&slot->key, memory_order_relaxed);
            if (atomic_load_explicit(&slot->state, memory_order_acquire) != RL_SLOT(pos, 1)) {
                if (atomic_load(&slot->state) != RL_SLOT(pos, 2)) return; /* reused: leave it */
                continue;
            }
            if (rl_key_lane(key) == c->lane && key > c->due_limit && key < low) low = key;
        }
    }
    if (low != RL_KEY_NONE) {
        uint64_t cur = atomic_load(&ln->ring_low);
        while (low < cur && !atomic_compare_exchange_weak(&ln->ring_low, &cur, low))
            ;
    }
    uint64_t expect = c->ring_skip;
    atomic_compare_exchange_strong(&ln->ring_skip, &expect, ((uint64_t)(uint32_t)P->gen << 32) | (uint32_t)to);
}

static Cursor *lane_open(Pass *P, uint32_t lane) {
    Cursor *c = &P->cursors[lane];
    if (c->stamp == P->stamp) return c;
    rl_seg *s = P->s;
    c->stamp = P->stamp;
    c->lane = lane;
    c->idx_done = c->ring_overflow = c->done = c->have_idx = c->have_peek = 0;
    c->rn = c->ri = 0;
    c->ring_read = 0;
    c->granted = c->spilled = c->stale = c->refused = c->tombs = 0;
    c->first_live = c->last_key = RL_KEY_NONE;
    c->due_limit = rl_encode(lane, (uint64_t)P->now);
    uint32_t lo = atomic_load_explicit(&P->lane_start[lane], memory_order_relaxed);
    uint32_t hi = atomic_load_explicit(&P->lane_start[lane + 1], memory_order_relaxed);
    if (hi > P->count) hi = P->count;
    if (lo > hi) lo = hi;
    /* Nothing due in this lane, neither indexed nor recent: leave it unopened (no seek). */
    int idx_due = lo < hi && (atomic_load_explicit(&P->ik[lo], memory_order_relaxed) & ~RL_TOMB) <= c->due_limit;
    uint64_t rmin = RL_RMIN_KEY(atomic_load(&s->lanes[lane].ring_min));
    if (!idx_due && rmin > c->due_limit) {
        c->done = 1;
        c->stamp = P->stamp - 1; /* not opened: no floor work */
        return NULL;
    }
    c->floor_word = atomic_load(&s->lanes[lane].floor); /* (a) before the scan */
    /* Skip hint: where an earlier pass of this index generation found the lane's stale prefix
     * to end. Entries before it are stale or below the floor, and a row that takes such a key
     * again was appended to the ring too, so starting there misses nothing and saves the seek.
     * Without one, seek: the lower bound of encode(lane, floor), reading on past `hi` (into the
     * next lane) being the one-sided part. */
    uint64_t hint = atomic_load(&s->lanes[lane].skip);
    uint64_t hint_floor = atomic_load(&s->lanes[lane].skip_floor); /* after the hint */
#ifdef RL_BENCH
    uint32_t lane_hi = hi;
#endif
    if (!BENCH(RL_BENCH_NO_SKIP) && (uint32_t)(hint >> 32) == (uint32_t)P->gen &&
        (uint32_t)hint >= lo && (uint32_t)hint <= P->count &&
        (uint32_t)(hint_floor >> 32) == (uint32_t)P->gen &&
        (uint32_t)hint_floor <= RL_FLOOR_MINUTE(c->floor_word)) {
        lo = (uint32_t)hint;
        c->sought = 0;
    } else {
        c->sought = 1;
        uint64_t seek = rl_encode(lane, BENCH(RL_BENCH_UNFLOORED) ? 0 : (uint64_t)RL_FLOOR_MINUTE(c->floor_word) * 60000u);
        while (lo < hi) {
            uint32_t mid = lo + (hi - lo) / 2;
            if ((atomic_load_explicit(&P->ik[mid], memory_order_relaxed) & ~RL_TOMB) < seek) lo = mid + 1;
            else hi = mid;
        }
    }
    c->pos = c->start = c->stale_run = c->pf = lo;
    c->ahead = PREFETCH_LOW; /* until a take asks for more (lane_take) */
    c->iv_pf = P->late && !P->unit && /* a row of the lane may have no class (head_interval) */
               atomic_load_explicit(&s->lanes[lane].iv_cls[RL_IV_CLASSES - 1], memory_order_relaxed) &&
               atomic_load_explicit(&s->lanes[lane].iv_min, memory_order_relaxed) !=
                   atomic_load_explicit(&s->lanes[lane].iv_max, memory_order_relaxed);
    c->end = (P->count - lo > P->window) ? lo + P->window : P->count;
#ifdef RL_BENCH
    if (BENCH(RL_BENCH_TWO_SIDED)) { /* the range's other end: the last due entry of the lane */
        uint32_t a = lo, b = lane_hi > lo ? lane_hi : lo;
        while (a < b) {
            uint32_t mid = a + (b - a) / 2;
            if ((atomic_load_explicit(&P->ik[mid], memory_order_relaxed) & ~RL_TOMB) <= c->due_limit) a = mid + 1;
            else b = mid;
        }
        if (a < c->end) c->end = a;
    }
#endif
    rows_prefetch(P, c);
    c->ring_min = RL_RMIN_KEY(atomic_load(&s->lanes[lane].ring_min)); /* (b) after W */
    if (c->ring_min <= c->due_limit) ring_collect(P, c);
    P->opened[P->nopened++] = c;
    return c;
}

static void notes_flush(Pass *P) {
    if (P->granted_any && !P->lease_noted) { /* before any tomb: see csrc/sweep.c */
        int64_t exp = P->now + P->lease_ms;
        rl_lease_min_note(P->s, exp > (int64_t)RL_HORIZON ? (int64_t)RL_HORIZON : exp);
        P->lease_noted = 1;
    }
    rl_index_tomb(P->s, P->owner, P->gen, P->nnotes, P->note_pos, P->note_key);
    P->nnotes = 0;
}

/* Ask for the index entry at `pos` (key `key`) to become a tombstone: its row was granted from
 * there, moved away, or is held in flight. */
static void note_tomb(Pass *P, uint32_t pos, uint64_t key) {
    if (BENCH(RL_BENCH_NO_TOMB)) return;
    uint32_t k = P->nnotes++;
    P->note_pos[k] = pos;
    P->note_key[k] = key;
    if (P->nnotes == NOTE_BATCH) notes_flush(P);
}

/* Cross the run of tombstones starting at `at` (following jumps), lengthen the jump stored in
 * its first entry when `mark`, and return the position after the run. The jump is written under
 * this owner's hazard, so it never lands in a buffer a merge is rewriting (csrc/index.c). A run
 * that begins the lane's stale prefix is marked only by a pass that began at a seek: otherwise
 * the skip hint this pass records moves past it, and the mark would cost two fences and a CAS
 * on every pass. A seek means a floor was lowered under the hint (a release, a lapsed lease put
 * back), and the next one crosses the same run: unmarked, it read the run whole each time. */
#define JUMP_WALK_MAX 4096
static uint32_t tomb_run(Pass *P, Cursor *c, uint32_t at, uint32_t first_row, int mark) {
    uint32_t next = at + ((first_row & RL_JUMP) ? (first_row & ~RL_JUMP) : 1);
    while (next < P->count && next - at < JUMP_WALK_MAX) {
        P->reads++;
        uint64_t raw = atomic_load_explicit(&P->ik[next], memory_order_relaxed);
        if (!(raw & RL_TOMB) || rl_key_lane(raw & ~RL_TOMB) != c->lane) break;
        uint32_t j = atomic_load_explicit(&P->ir[next], memory_order_relaxed);
        next += (j & RL_JUMP) ? (j & ~RL_JUMP) : 1;
    }
    if (next > P->count) next = P->count;
    uint32_t span = next - at;
    uint32_t had = (first_row & RL_JUMP) ? (first_row & ~RL_JUMP) : 1;
    if (mark && span > had && span >= 4) {
        rl_seg *s = P->s;
        _Atomic uint64_t *hz = &s->owners[P->owner].hazard;
        if (rl_hazard_enter(hz, P->gen)) {
            if (atomic_load(&s->h->index_gen) == P->gen) {
                uint32_t expect = first_row;
                atomic_compare_exchange_strong(&s->irows[P->gen & 1][at], &expect, RL_JUMP | span);
            }
            rl_hazard_leave(hz);
        }
    }
    return next;
}

/* How many entries of the lane, from the window's end on, are due by key: the lane's backlog a
 * pass left unread (its `spilled` counter; a binary search, only when a window runs out). Stale
 * entries among them count too, so it is an upper bound. */
static uint32_t due_past(Pass *P, Cursor *c) {
    uint32_t a = c->end, b = P->count;
    while (a < b) {
        uint32_t mid = a + (b - a) / 2;
        if ((atomic_load_explicit(&P->ik[mid], memory_order_relaxed) & ~RL_TOMB) <= c->due_limit) a = mid + 1;
        else b = mid;
    }
    return a - c->end;
}

/* The next index entry of the lane that is live and due, or none. */
static void idx_advance(Pass *P, Cursor *c) {
    while (!c->have_idx && !c->idx_done) {
        if (c->pos >= c->end) { /* the window ran out: due entries past it wait for a pass */
            if (c->end < P->count) c->spilled = due_past(P, c);
            c->idx_done = 1;
            break;
        }
        P->reads++;
        uint64_t raw = atomic_load_explicit(&P->ik[c->pos], memory_order_relaxed);
        uint64_t key = raw & ~RL_TOMB;
        uint32_t row = atomic_load_explicit(&P->ir[c->pos], memory_order_relaxed);
        rows_prefetch(P, c);
        c->pos++;
        if (rl_key_lane(key) != c->lane) {
            if (rl_key_lane(key) < c->lane) c->stale++; /* torn read of a rewritten buffer */
            c->idx_done = 1;
            break;
        }
        c->last_key = key;
        if (raw & RL_TOMB) { /* a tombstone run costs one step, and no window */
            uint32_t at = c->pos - 1;
            uint32_t next = tomb_run(P, c, at, row,
                                     c->stale_run != at || c->sought || BENCH(RL_BENCH_NO_SKIP));
            c->stale += next - at;
            c->tombs += next - at;
            if (c->stale_run == at) c->stale_run = next;
            c->last_key = atomic_load_explicit(&P->ik[next - 1], memory_order_relaxed) & ~RL_TOMB;
            c->end = (P->count - c->end > next - at) ? c->end + (next - at) : P->count; /* no window */
            c->pos = next;
            if (c->last_key > c->due_limit) c->idx_done = 1;
            continue;
        }
        /* Stale (its row moved) or held in flight: out of the index from now on, and the
         * stretch before it stays skippable. */
        uint64_t word = row < P->used ? atomic_load_explicit(&P->s->rows[row].word, memory_order_acquire)
                                      : RL_KEY_NONE;
        int live = RL_WORD_KEY(word) == key && !held_in_flight(P, row, word);
        if (!live) {
            if (c->stale_run == c->pos - 1) c->stale_run = c->pos;
            if (row < P->used) note_tomb(P, c->pos - 1, key);
            c->stale++;
            if (key > c->due_limit) { /* past the due ones: the lane ends here */
                c->idx_done = 1;
                break;
            }
            if (c->end < P->count) c->end++; /* no window used */
            continue;
        }
        if (c->first_live == RL_KEY_NONE) c->first_live = key;
        if (key > c->due_limit) { /* first entry not yet due: the lane ends here */
            c->idx_done = 1;
            break;
        }
        c->idx = (Cand){key, row, c->pos - 1};
        c->have_idx = 1;
    }
}

/* Find the lane's next claimable candidate in EDF order (none peeked); 0 when none is left. */
static int lane_peek_next(Pass *P, Cursor *c) {
    for (;;) {
        idx_advance(P, c);
        int has_ring = c->ri < c->rn;
        Cand cand;
        int from_idx = 0;
        if (c->have_idx && has_ring) {
            Cand *r = &c->ring[c->ri];
            if (r->key < c->idx.key || (r->key == c->idx.key && r->row < c->idx.row)) {
                cand = *r;
                c->ri++;
            } else {
                cand = c->idx;
                c->have_idx = 0;
                from_idx = 1;
            }
        } else if (c->have_idx) {
            if (c->ring_overflow) { /* unread ring rows may precede it: keep EDF, stop here */
                c->done = 1;
                return 0;
            }
            cand = c->idx;
            c->have_idx = 0;
            from_idx = 1;
        } else if (has_ring) {
            cand = c->ring[c->ri++];
        } else {
            c->done = 1;
            return 0;
        }
        uint64_t w = atomic_load_explicit(&P->s->rows[cand.row].lease, memory_order_acquire);
        if (!lease_claimable(P, w)) { /* leased since it was read: the next entry, no window used */
            c->refused++;
            if (from_idx && c->end < P->count) c->end++;
            continue;
        }
        c->peek = cand;
        c->peek_word = w;
        c->have_peek = 1;
        return 1;
    }
}

/* Peek the lane's next claimable candidate in EDF order; 0 when the lane has none left. Inline
 * where one is peeked already: a lateness pass peeks a head to weigh it, then takes it. */
static inline int lane_peek(Pass *P, Cursor *c) {
    return c && !c->done && (c->have_peek || lane_peek_next(P, c));
}

/* Lease the peeked candidate; 1 on a grant. */
static int lane_take_one(Pass *P, Cursor *c) {
    rl_seg *s = P->s;
    while (lane_peek(P, c)) {
        c->have_peek = 0;
        rl_row *row = &s->rows[c->peek.row];
        uint64_t w = c->peek_word;
        int64_t exp = P->now + P->lease_ms;
        if (exp > (int64_t)RL_HORIZON) exp = (int64_t)RL_HORIZON;
        uint64_t nw = RL_LEASE_MAKE(exp, P->owner, RL_LEASE_TOK(w) + 1u);
        if (!atomic_compare_exchange_strong(&row->lease, &w, nw)) {
            c->refused++;
            if (!(c->peek.pos & CAND_RING)) {
                /* Lost the row to another claimer walking the same entries. Following it entry
                 * by entry loses every race after this one too (both processes CAS the same
                 * lines in lockstep), so step over the stretch it is likely taking: as many
                 * entries as this pass still wants. They stay queued for the next pass. This
                 * bends due order only between concurrent claims, and only after this pass's
                 * first live entry, so the floor's proposal is the same. */
                uint32_t jump = P->budget - P->n;
                if (jump > JUMP_MAX) jump = JUMP_MAX;
                if (jump > c->end - c->pos) jump = c->end - c->pos;
                c->pos += jump;
            }
            continue;
        }
        /* The key may have moved between the check and the CAS (remove, prioritize). */
        uint64_t key = RL_WORD_KEY(atomic_load(&row->word));
        if (key == RL_KEY_NONE || rl_key_due(key) > (uint64_t)P->now) {
            uint64_t back = nw;
            if (atomic_compare_exchange_strong(&row->lease, &back, RL_LEASE_FREE(nw)))
                rl_lease_freed(s, c->peek.row);
            c->stale++;
            continue;
        }
        /* Taken out: no pass reads it again until its lease ends (csrc/sweep.c). */
        atomic_fetch_or_explicit(&row->word, RL_WORD_FLIGHT, memory_order_acq_rel);
        P->granted_any = 1;
        uint32_t i = P->n++;
        P->out_rows[i] = c->peek.row;
        P->out_lanes[i] = rl_key_lane(key);
        P->out_due[i] = (int64_t)rl_key_due(key);
        P->out_tokens[i] = (int64_t)(nw ^ rl_token_mask(c->peek.row));
        c->granted++;
        if (!(c->peek.pos & CAND_RING)) note_tomb(P, c->peek.pos, c->peek.key);
        P->cls_granted[rl_class_of(P->p, c->lane)]++;
        return 1;
    }
    return 0;
}

static uint32_t lane_take(Pass *P, uint32_t lane, uint32_t want) {
    uint32_t got = 0;
    if (want == 0 || P->n >= P->budget) return 0;
    Cursor *c = lane_open(P, lane);
    if (c) { /* prefetch for the grants wanted (and a few stale entries), not a whole batch */
        uint32_t need = (want < P->budget - P->n ? want : P->budget - P->n) + PREFETCH_LOW;
        if (need > PREFETCH_AHEAD) need = PREFETCH_AHEAD;
        if (need > c->ahead) c->ahead = need;
    }
    while (got < want && P->n < P->budget && lane_take_one(P, c)) got++;
    return got;
}

static uint32_t class_take(Pass *P, uint32_t cls, uint32_t want) {
    uint32_t got = 0;
    for (uint32_t l = 0; l < P->lanes && got < want; l++)
        if (rl_class_of(P->p, l) == cls) got += lane_take(P, l, want - got);
    return got;
}

static int class_has_due(Pass *P, uint32_t cls) {
    for (uint32_t l = 0; l < P->lanes; l++)
        if (rl_class_of(P->p, l) == cls && lane_peek(P, lane_open(P, l))) return 1;
    return 0;
}

/* ---- share credit: shared words, CAS only ---- */

static void credit_accrue(rl_seg *s, uint32_t cls, int64_t add, int64_t cap) {
    _Atomic int64_t *w = &s->h->credit[cls].credit;
    int64_t cur = atomic_load(w), next;
    do {
        next = cur + add < cap ? cur + add : cap;
    } while (!atomic_compare_exchange_weak(w, &cur, next));
}

/* Reserve the whole grants a class's credit allows (at most `most`) with one CAS, so workers
 * claiming at the same moment cannot all spend the same credit; unused ones go back after. */
static uint32_t credit_reserve(rl_seg *s, uint32_t cls, uint32_t most) {
    _Atomic int64_t *w = &s->h->credit[cls].credit;
    int64_t cur = atomic_load(w);
    uint32_t want;
    do {
        want = cur > 0 ? (uint32_t)(cur / RL_ONE) : 0;
        if (want > most) want = most;
        if (want == 0) return 0;
    } while (!atomic_compare_exchange_weak(w, &cur, cur - (int64_t)want * RL_ONE));
    return want;
}

static void credit_refund(rl_seg *s, uint32_t cls, uint32_t unused) {
    if (unused) atomic_fetch_add(&s->h->credit[cls].credit, (int64_t)unused * RL_ONE);
}

/* Grants a floor class got from the remainder count against its credit, down to zero. */
static void credit_absorb(rl_seg *s, uint32_t cls, uint32_t got) {
    _Atomic int64_t *w = &s->h->credit[cls].credit;
    int64_t cur = atomic_load(w), next;
    if (!got) return;
    do {
        if (cur <= 0) return;
        next = cur - (int64_t)got * RL_ONE;
        if (next < 0) next = 0;
    } while (!atomic_compare_exchange_weak(w, &cur, next));
}

/* ---- the pass ---- */

/* The lanes a remainder weighs: those a row was ever put in (lanes_used, set before the row is
 * visible), from lane 1 when urgent is capped: the others are not read at all. */
static uint64_t remainder_lanes(const Pass *P, int skip_urgent) {
    uint64_t used = atomic_load(&P->s->h->lanes_used) & ~(uint64_t)(skip_urgent ? 1 : 0);
    return P->lanes < RL_MAX_LANES ? used & ((1ull << P->lanes) - 1) : used;
}

/* The lane whose head is latest relative to its own interval takes each grant: the head's
 * lateness is weight x (now - due) / interval, an interval of 0 counting as 1 s, worked out in
 * doubles as fl(fl(w x dt) / iv) (w < 2^26 and dt < 2^42 convert exactly; a product and a
 * quotient each round once, as engine.policy's reference_pass and the Lua pass round them). The
 * lanes are compared by that lateness in quanta of a 64th (LATE_BITS: a double's exponent and
 * its top six mantissa bits; a quantum spans 0.8 to 1.6 % of the lateness in it), ties to the
 * lower lane: a lane's key (late_key) is its quantum, then the lane, one integer compare. Only due
 * heads are candidates (lane_peek stops at the first row not yet due), so now - due >= 0.
 * Within a lane the order stays EDF: only the choice between lane heads changes. Quanta, not
 * exact ratios: heads of lanes that tie take turns row by row when compared exactly (in the
 * production shape, bench_constraints (f), the two lanes of one band do), and each turn cost a
 * mispredicted branch and a weighing; quanta keep a lane's grants together while its heads
 * stay in the runner-up's quantum, and cost at most 1.6 % of lateness in order
 * (docs/design.md §3). The edf remainder is this pass with every lane weighing 1 and every
 * interval 1 s (Pass.unit): a head weighs now - due, its intervals never read.
 *
 * What a lane-order pass does not pay: opening every lane (its seek, its rows, its floor work at
 * the end of the pass) and weighing every head by its interval. So a lane is
 * opened only while it may win. Until then it is weighed by a bound: no live row is below its
 * floor minute and none has an interval below iv_min (a word beside the floor, moved only
 * downward by rl_publish before a row is visible), so its lateness is at most weight x
 * (now - floor) / iv_min, and quanta keep that order. When that decides nothing, it is weighed
 * by its head as this thread's last pass left it (HeadMemo), while that still holds, and opened
 * only when that does not hold or it wins. An opened lane's head is weighed at once: its
 * interval is the lane's one where its bounds have met, else the one its row word's class names
 * in the lane's table (csrc/layout.h), else the row's own, prefetched with its rows then. Read
 * from the intervals array, a cache line of its own a head, it was half of what the pass cost
 * over lane order in the production shape (bench_constraints (f): two intervals a busy lane).
 * The lanes are sorted by their keys, most lateness first: the first takes the grant when it
 * is weighed by its head (not a bound) and its key beats the second's (the runner-up); otherwise
 * whichever of the two is a bound is weighed (by its memo, or opened), which changes no choice
 * and only lowers its key. The winner keeps the grants while its next head still beats that
 * runner-up (late_run). A write racing the pass may be missed by it, as by any pass; bounds
 * read at its start hold for every row that was there when it started. */
#define LATE_BITS 6

typedef struct {
    uint64_t key;  /* late_key of the head; of the floor for a bound */
    uint8_t state; /* LATE_* */
} LateHead;
#define LATE_BOUND 0 /* not opened: its key bounds its head's from above */
#define LATE_EXACT 1 /* opened, a due head: the head's key */
#define LATE_MEMO 2  /* not opened, its head known from this thread's last pass: that head's key */
#define LATE_NONE 3  /* opened, nothing left */

/* The quantum of a lateness v >= 0: its bits' order is the doubles' order, and those past the
 * top LATE_BITS of the mantissa are dropped (0 for 0). */
static inline uint64_t late_q(double v) {
    uint64_t b;
    memcpy(&b, &v, sizeof b);
    return b >> (52 - LATE_BITS);
}

/* The least lateness of quantum q: v >= late_floor(q) exactly when late_q(v) >= q. */
static inline double late_floor(uint64_t q) {
    uint64_t b = q << (52 - LATE_BITS);
    double v;
    memcpy(&v, &b, sizeof v);
    return v;
}

/* A lane's key: the quantum of its lateness, then the lane (the lower lane the higher key). */
static inline uint64_t late_key(double v, uint32_t lane) {
    return late_q(v) << 8 | (255u - lane);
}

/* The lateness w x dt / iv, rounded as reference_pass rounds it. */
static inline double late_of(uint32_t w, uint64_t dt, uint32_t iv) {
    return (double)w * (double)(int64_t)dt / iv; /* dt < 2^42: a signed conversion is one step */
}

/* The intervals a pass weighs heads by: none (every interval 1 s) for edf. */
static inline const _Atomic uint32_t *pass_ivs(const Pass *P) {
    return P->unit ? NULL : P->s->intervals;
}

/* The interval of lane l's head `row` of key `key` (0 counts as 1 s): the lane's one interval
 * when its bounds have met, else the one the row word's class names in the lane's table (the
 * word's line was read to find the head: no new line), else (no class: the table was full) the
 * row's own, a cache line of its own. The bounds are read after the head was: rl_publish widens
 * them before a row is visible, so they take the head in. A word rewritten since the head was
 * read names another key: its class may be another lane's, so the array is read. */
static inline uint32_t head_interval(const rl_seg *s, const rl_lane *ln, const _Atomic uint32_t *ivs,
                                     uint32_t row, uint64_t key) {
    if (!ivs) return 1; /* edf: every interval 1 s */
    uint32_t lo = atomic_load_explicit(&ln->iv_min, memory_order_acquire);
    if (lo && lo == atomic_load_explicit(&ln->iv_max, memory_order_acquire)) return lo;
    uint64_t word = atomic_load_explicit(&s->rows[row].word, memory_order_acquire);
    uint32_t cls = RL_WORD_CLS(word), iv;
    if (cls && RL_WORD_KEY(word) == key) /* the slot was filled before the word was stored */
        return atomic_load_explicit(&ln->iv_cls[cls - 1], memory_order_relaxed);
    iv = atomic_load_explicit(&ivs[row], memory_order_relaxed);
    return iv ? iv : 1;
}

/* The key of lane l's head `row`, of key `key` (w: the lane's weight). */
static inline uint64_t head_key(const Pass *P, uint32_t l, uint32_t w, uint64_t key, uint32_t row) {
    uint64_t due = rl_key_due(key);
    uint64_t dt = (uint64_t)P->now > due ? (uint64_t)P->now - due : 0;
    return late_key(late_of(w, dt, head_interval(P->s, &P->s->lanes[l], pass_ivs(P), row, key)), l);
}

/* A lane's head as this thread's last lateness pass that opened the lane left it: the first
 * claimable row it would have granted next. A later pass of the same index generation, when
 * the lane's bound decides nothing, weighs the lane from it instead of opening it (its
 * seek, its rows, its floor work at the end), while that row still holds the key, out of
 * flight and claimable, and nothing ahead of it was written into the lane: every write that
 * makes a row visible appends it to the ring and lowers the lane's ring_min first
 * (csrc/floor.c), so a ring_min above the head's key says no row came back or arrived ahead of
 * it, and within a generation the index gains no entry. Claims only take rows away. The one row
 * that comes back unwritten is one whose lease lapsed (or whose owner died) before the sweep
 * puts it back: a pass uses memos only while lease_min says there is none. The lane is opened
 * when it wins a grant, as before. Kept in the lane's cursor (Cursor.memo), which no pass resets. */

/* Whether lane l's memo holds; if so, its head's key in h (w: the lane's weight). */
static int head_memo(const Pass *P, uint32_t l, uint32_t w, LateHead *h) {
    const HeadMemo *m = &P->cursors[l].memo;
    if (m->serial != P->s->serial || m->gen != P->gen || m->row >= P->used) return 0;
    uint64_t due = rl_key_due(m->key);
    if (due > (uint64_t)P->now ||
        RL_RMIN_KEY(atomic_load_explicit(&P->s->lanes[l].ring_min, memory_order_acquire)) <= m->key)
        return 0;
    const rl_row *r = &P->s->rows[m->row];
    uint64_t word = atomic_load_explicit(&r->word, memory_order_acquire);
    if ((word & RL_WORD_FLIGHT) || RL_WORD_KEY(word) != m->key ||
        !lease_claimable(P, atomic_load_explicit(&r->lease, memory_order_acquire)))
        return 0;
    h->key = head_key(P, l, w, m->key, m->row);
    h->state = LATE_MEMO;
    return 1;
}

/* At the end of a lateness pass: remember the head each opened lane would grant next (or forget
 * the lane's memo: none was peeked, or the index moved under the pass). */
static void heads_note(const Pass *P, Cursor *c, int gen_moved) {
    HeadMemo *m = &c->memo;
    if (gen_moved || !c->have_peek) {
        m->serial = 0;
        return;
    }
    *m = (HeadMemo){P->s->serial, P->gen, c->peek.key, c->peek.row};
}

/* Open lane l (if it is not) and weigh its head (w: the lane's weight). */
static void late_peek(Pass *P, uint32_t l, LateHead *h, uint32_t w) {
    Cursor *c = lane_open(P, l);
    if (!lane_peek(P, c)) {
        h->state = LATE_NONE;
        return;
    }
    h->key = head_key(P, l, w, c->peek.key, c->peek.row);
    h->state = LATE_EXACT;
}

/* The lanes a lateness pass weighs, sorted by key, highest first: the first two are the two a
 * grant is decided between. Only an opening lowers a lane's key, and only the first's may rise
 * (its next head), so sinking the lane that moved keeps the order. (A scan of every lane for
 * the top three at each decision, tried instead, cost more where 40 lanes are in use:
 * bench_constraints (e), spread.) */
typedef struct {
    uint8_t at[RL_MAX_LANES];
    uint32_t n;
} LaneOrder;

/* at[i]'s key fell (or, at 0, rose): move it down to its place. */
static inline void order_sink(LaneOrder *q, const LateHead *h, uint32_t i) {
    uint8_t l = q->at[i];
    for (; i + 1 < q->n && h[q->at[i + 1]].key > h[l].key; i++) q->at[i] = q->at[i + 1];
    q->at[i] = l;
}

/* Lane l joins. */
static inline void order_add(LaneOrder *q, const LateHead *h, uint8_t l) {
    uint32_t i = q->n++;
    for (; i > 0 && h[l].key > h[q->at[i - 1]].key; i--) q->at[i] = q->at[i - 1];
    q->at[i] = l;
}

/* at[i] has nothing left. */
static inline void order_drop(LaneOrder *q, uint32_t i) {
    for (q->n--; i < q->n; i++) q->at[i] = q->at[i + 1];
}

/* The first lane of q won a grant over the second, the runner-up (if any): take grants from it
 * while its head beats the runner-up's key, which stays put meanwhile: while the head's
 * lateness is at least `least`, the least of the quantum it must reach (the runner-up's, one
 * more when the runner-up is the lower lane). Where its head stops beating it, the head's key
 * goes into h; then, when the runner-up is opened and that head still beats the third lane,
 * the two swap, as order_sink and the pass's next decision would, and the runner-up takes the
 * grants here. Returns with the first lane to sink (LATE_NONE: to drop), or the budget met. */
static void late_run(Pass *P, LateHead *h, LaneOrder *q, const uint32_t *wt) {
    uint64_t now = (uint64_t)P->now;
    const _Atomic uint32_t *ivs = pass_ivs(P);
    for (;;) {
        uint32_t b = q->at[0], w = wt[b];
        int r = q->n > 1 ? q->at[1] : -1;
        Cursor *c = &P->cursors[b];
        const rl_lane *ln = &P->s->lanes[b]; /* for head_interval, found once */
        uint32_t need = P->budget - P->n + PREFETCH_LOW; /* prefetch as a take of the rest would: */
        if (need > PREFETCH_AHEAD) need = PREFETCH_AHEAD; /* the lane may well keep winning */
        if (need > c->ahead) c->ahead = need;
        /* Heads come in due order, each visible before iv_max is read here, so within it: a
         * head whose w x dt passes least x iv_max by more than the roundings can take back
         * (1e-9) has w x dt / iv_max past `least`: it beats r without its interval being
         * read, a multiply and a compare a grant. Without a runner-up every head wins. */
        double least = r < 0 ? 0 : late_floor((h[r].key >> 8) + (b > (uint32_t)r)), wd = w;
        double iv_max = ivs ? atomic_load_explicit(&ln->iv_max, memory_order_acquire) : 1;
        double sure = least * iv_max * (1 + 1e-9);
        for (;;) {
            lane_take_one(P, c); /* a lost race exhausts the lane or grants; no spin */
            if (P->n >= P->budget) return;
            if (!lane_peek(P, c)) {
                h[b].state = LATE_NONE;
                return;
            }
            uint64_t due = rl_key_due(c->peek.key), dt = now > due ? now - due : 0;
            double late = wd * (double)(int64_t)dt; /* w x dt, rounded as late_of rounds it */
            if (late > sure) continue;
            double v = late / head_interval(P->s, ln, ivs, c->peek.row, c->peek.key);
            if (v >= least) continue;
            h[b].key = late_key(v, b);
            h[b].state = LATE_EXACT;
            break;
        }
        if (h[r].state != LATE_EXACT || (q->n > 2 && h[b].key < h[q->at[2]].key)) return;
        q->at[0] = (uint8_t)r, q->at[1] = (uint8_t)b;
    }
}

/* A band lane's spread weight, (hi / lo) ** (3 / 16) in RL_ONE fixed point rounded half up, as
 * engine.policy.spread_weight_fp computes it (one libm pow of the same doubles). */
static uint32_t spread_weight(uint32_t lo, uint32_t hi) {
    return (uint32_t)floor(pow((double)hi / (double)lo, (double)RL_SPREAD_NUM / RL_SPREAD_DEN) * RL_ONE + 0.5);
}

/* The weight of lanes first .. P->lanes - 1: the policy's, or with weights_live derived from
 * the lanes' weight bounds (wv_min, wv_max: the rows written since the bands took effect;
 * engine.policy.interval_weights_fp): a submitted or discovered lane that holds such rows
 * weighs its spread, four times that when it holds the shortest interval of those lanes;
 * urgent, cold and the other lanes, 1. A thread keeps what it derived until a bound moves
 * (wv_epoch), or the policy, the lanes or the segment: pow is paid only then. */
static __thread struct { /* one struct: one thread-local lookup, not one per word */
    uint64_t seg, epoch, policy;
    uint32_t lanes, wt[RL_MAX_LANES];
} tls_wt = {.policy = UINT64_MAX};

static void lane_weights(const Pass *P, uint32_t first, uint32_t *wt) {
    const rl_policy *p = P->p;
    if (P->unit) { /* edf: a head weighs its lateness in ms */
        for (uint32_t l = first; l < P->lanes; l++) wt[l] = 1;
        return;
    }
    if (!p->weights_live) {
        for (uint32_t l = first; l < P->lanes; l++) wt[l] = p->weight[l];
        return;
    }
    /* as this thread derived them last, unless a bound, the policy, the lanes or the segment
     * moved since (the epoch is read before the bounds, so a widening after it derives again) */
    uint64_t epoch = atomic_load(&P->s->h->wv_epoch), version = atomic_load(&P->s->h->policy_version);
    if (tls_wt.seg == P->s->serial && tls_wt.epoch == epoch && tls_wt.policy == version &&
        tls_wt.lanes == P->lanes) {
        memcpy(wt, tls_wt.wt, P->lanes * sizeof *wt);
        return;
    }
    uint32_t ivmin[RL_MAX_LANES], ivmax[RL_MAX_LANES];
    for (uint32_t l = 0; l < P->lanes; l++) { /* every lane (first or not), for the cache */
        ivmin[l] = atomic_load_explicit(&P->s->lanes[l].wv_min, memory_order_relaxed);
        ivmax[l] = atomic_load_explicit(&P->s->lanes[l].wv_max, memory_order_relaxed);
    }
    uint32_t last = 2 * (p->band_count + 1), shortest = UINT32_MAX; /* band lanes: 1 .. last */
    for (uint32_t l = 0; l < P->lanes; l++)
        if (l >= 1 && l <= last && ivmax[l] && (ivmin[l] ? ivmin[l] : 1) < shortest)
            shortest = ivmin[l] ? ivmin[l] : 1;
    for (uint32_t l = 0; l < P->lanes; l++) {
        wt[l] = RL_ONE;
        if (l < 1 || l > last || !ivmax[l]) continue;
        uint32_t lo = ivmin[l] ? ivmin[l] : 1;
        uint64_t w = spread_weight(lo, ivmax[l]);
        if (lo == shortest) w *= RL_FIRST_BAND_WEIGHT;
        wt[l] = w > RL_WEIGHT_MAX ? RL_WEIGHT_MAX : (uint32_t)w;
    }
    memcpy(tls_wt.wt, wt, P->lanes * sizeof *wt);
    tls_wt.seg = P->s->serial, tls_wt.epoch = epoch, tls_wt.policy = version;
    tls_wt.lanes = P->lanes;
}

static void remainder_lateness(Pass *P, int skip_urgent) {
    LateHead h[RL_MAX_LANES];
    uint32_t wt[RL_MAX_LANES];
    LaneOrder q = {.n = 0}; /* the lanes that may have a head */
    uint64_t used = remainder_lanes(P, skip_urgent); /* a 64-lane layout pays for those used */
    lane_weights(P, skip_urgent ? 1 : 0, wt);
    /* heads remembered from this thread's last pass hold only while no lapsed lease waits for
     * the sweep (HeadMemo); a lane's is read only when its bound decides nothing */
    uint64_t lmin = atomic_load(&P->s->h->lease_min);
    int memos = !(lmin & RL_LMIN_SWEEPING) && RL_LMIN_MS(lmin) > P->now;
    uint64_t opened = 0; /* by a floor class: those are weighed by their heads */
    for (uint32_t i = 0; i < P->nopened; i++) opened |= 1ull << P->opened[i]->lane;
    for (uint64_t m = used; m; m &= m - 1) {
        uint32_t l = (uint32_t)__builtin_ctzll(m);
        if (opened >> l & 1) {
            late_peek(P, l, &h[l], wt[l]);
            if (h[l].state != LATE_NONE) order_add(&q, h, (uint8_t)l);
            continue;
        }
        rl_lane *ln = &P->s->lanes[l];
        uint32_t ivmin = atomic_load_explicit(&ln->iv_min, memory_order_acquire);
        uint32_t ivmax = atomic_load_explicit(&ln->iv_max, memory_order_acquire);
        uint32_t fm = RL_FLOOR_MINUTE(atomic_load_explicit(&ln->floor, memory_order_acquire));
        if (ivmax == 0) /* no row was ever published into it (its bounds come first) */
            continue;
        uint64_t since = (uint64_t)fm * 60000u; /* no floor (0) bounds nothing */
        uint64_t dt = (uint64_t)P->now > since ? (uint64_t)P->now - since : 0;
        h[l].key = late_key(late_of(wt[l], dt, ivmin && !P->unit ? ivmin : 1), l);
        h[l].state = LATE_BOUND;
        order_add(&q, h, (uint8_t)l);
    }
    while (P->n < P->budget) {
        int best, run;
        for (;;) {
            /* best: the lane of the highest key (the first); run: the highest of the others
             * (the second). best wins unless it is a bound (a head's key beats every key
             * below it, a bound's included); then it is weighed by its memo, else opened,
             * which lowers its key (it sinks) */
            if (q.n == 0) return;
            best = q.at[0];
            run = q.n == 1 ? -1 : q.at[1];
            if (run < 0 || h[best].state != LATE_BOUND) break;
            if (!memos || !head_memo(P, best, wt[best], &h[best]))
                late_peek(P, best, &h[best], wt[best]);
            if (h[best].state == LATE_NONE) order_drop(&q, 0);
            else order_sink(&q, h, 0);
        }
        if (h[best].state != LATE_EXACT) { /* not opened: won on its memo, or a bound left
                                            * alone (no runner-up). Its cursor is a past pass's,
                                            * maybe another segment's: open it before taking
                                            * from it, and decide again should its head not be
                                            * the one weighed (a write racing this pass) */
            uint64_t was = h[best].key;
            late_peek(P, (uint32_t)best, &h[best], wt[best]);
            if (h[best].state == LATE_NONE) {
                order_drop(&q, 0);
                continue;
            }
            if (run >= 0 && h[best].key != was) {
                order_sink(&q, h, 0);
                continue;
            }
        }
        late_run(P, h, &q, wt); /* best is opened: it has a head */
        if (P->n >= P->budget) return;
        if (h[q.at[0]].state == LATE_NONE) order_drop(&q, 0);
        else order_sink(&q, h, 0); /* its lateness moved (the first's may rise: it stays first) */
    }
}

static void floors_raise(Pass *P) {
    rl_seg *s = P->s;
    int gen_moved = atomic_load(&s->h->index_gen) != P->gen; /* (c) */
    for (uint32_t i = 0; i < P->nopened; i++) {
        Cursor *c = P->opened[i];
        uint32_t l = c->lane;
        rl_lane *ln = &s->lanes[l];
        if (c->granted) atomic_fetch_add_explicit(&ln->granted, c->granted, memory_order_relaxed);
        if (c->spilled) atomic_fetch_add_explicit(&ln->spilled, c->spilled, memory_order_relaxed);
        if (c->stale) atomic_fetch_add_explicit(&ln->stale_skipped, c->stale, memory_order_relaxed);
        if (c->stale - c->tombs > P->window) P->advice |= RL_ADVISE_COMPACT;
        if (c->refused) atomic_fetch_add_explicit(&ln->lease_refused, c->refused, memory_order_relaxed);
        if (P->late) heads_note(P, c, gen_moved);
        if (gen_moved) continue;
        if (c->ring_read) ring_hint_advance(P, c);
        { /* record where the stale prefix ends; within a generation only forward. First the
           * floor minute this pass read (the highest of the generation's), then the hint. */
            uint32_t fm = RL_FLOOR_MINUTE(c->floor_word);
            uint64_t curf = atomic_load(&ln->skip_floor), wantf = ((uint64_t)(uint32_t)P->gen << 32) | fm;
            while (((uint32_t)(curf >> 32) != (uint32_t)P->gen || (uint32_t)curf < fm) &&
                   !atomic_compare_exchange_weak(&ln->skip_floor, &curf, wantf))
                ;
            uint64_t cur = atomic_load_explicit(&ln->skip, memory_order_relaxed);
            uint64_t want = ((uint64_t)(uint32_t)P->gen << 32) | c->stale_run;
            while (((uint32_t)(cur >> 32) != (uint32_t)P->gen || (uint32_t)cur < c->stale_run) &&
                   !atomic_compare_exchange_weak(&ln->skip, &cur, want))
                ;
        }
        uint64_t basis = c->first_live != RL_KEY_NONE ? c->first_live : c->last_key;
        if (basis == RL_KEY_NONE) continue;
        if (c->ring_min < basis) basis = c->ring_min;
        rl_floor_raise(s, l, c->floor_word, rl_minute(rl_key_due(basis)));
    }
}

uint64_t rl_index_reads(void) { return tls_reads; }

int rl_claim(rl_seg *s, uint32_t owner, uint32_t budget, int64_t now_ms, int64_t lease_ms,
             uint32_t window, int64_t *out, uint32_t *advice) {
    if (budget == 0 || window == 0 || lease_ms <= 0 || now_ms < 0 || now_ms >= (int64_t)RL_STRIDE)
        return RL_E_VALUE;
    if (owner == 0 || owner >= RL_MAX_OWNERS) return RL_E_VALUE;
    rl_owners_check(s);                /* every 100 ms, one pass looks for dead owners */
    rl_sweep_if_due(s, owner, now_ms); /* put back rows whose lease ended unseen */
    Pass P;
    P.s = s;
    P.owner = owner;
    P.now = now_ms;
    P.lease_ms = lease_ms;
    P.window = window;
    P.gen = atomic_load(&s->h->index_gen);
    uint32_t buf = P.gen & 1;
    P.count = atomic_load(&s->h->index_count[buf]);
    if (P.count > s->h->row_capacity) P.count = s->h->row_capacity;
    P.used = used_now(s); /* after index_gen: the index names no row past it (used_now) */
    P.ik = s->ikeys[buf];
    P.ir = s->irows[buf];
    P.lane_start = s->h->lane_start[buf];
    P.p = rl_policy_cached(s);
    P.lanes = atomic_load_explicit(&s->h->lanes_high, memory_order_relaxed) + 1;
    if (P.lanes > RL_MAX_LANES) P.lanes = RL_MAX_LANES;
    P.n = 0;
    P.budget = budget;
    P.out_rows = out;
    P.out_lanes = out + budget;
    P.out_due = out + 2 * (size_t)budget;
    P.out_tokens = out + 3 * (size_t)budget;
    P.advice = 0;
    P.nopened = 0;
    P.nnotes = 0;
    P.reads = 0;
    P.granted_any = P.lease_noted = 0;
    memset(P.cls_granted, 0, sizeof P.cls_granted);
    P.stamp = ++tls_stamp;
    P.cursors = tls_cursors;
    memo_reset();

    const rl_policy *p = P.p;
    P.late = p->lanes_enabled && p->remainder != RL_REMAINDER_LANE_ORDER;
    P.unit = p->remainder == RL_REMAINDER_EDF;
    if (!p->lanes_enabled) {
        for (uint32_t l = 0; l < P.lanes && P.n < budget; l++) lane_take(&P, l, budget);
    } else {
        int capped = p->urgent_share < RL_ONE;
        /* 1. accrue */
        for (uint32_t cls = 0; cls < RL_CLASSES; cls++) {
            /* urgent is always accounted while capped, even at share 0: the cap then also
             * sheds credit banked under an earlier, larger share */
            int64_t fp = cls == 0 ? (capped ? (int64_t)p->urgent_share : -1) : (int64_t)p->min_share[cls];
            if ((fp > 0 || (cls == 0 && fp == 0)) && class_has_due(&P, cls))
                credit_accrue(s, cls, fp * budget, fp * budget + RL_ONE);
        }
        /* 2. urgent_cap: urgent, capped */
        if (capped) {
            uint32_t held = credit_reserve(s, 0, budget);
            credit_refund(s, 0, held - lane_take(&P, 0, held));
        }
        /* 3. floors, in lane order of their classes */
        for (uint32_t cls = 1; cls < RL_CLASSES; cls++)
            if (p->min_share[cls] > 0) {
                uint32_t held = credit_reserve(s, cls, budget - P.n);
                credit_refund(s, cls, held - class_take(&P, cls, held));
            }
        /* 4. remainder: remainder_edf, remainder_lateness, or lane order */
        uint32_t before[RL_CLASSES];
        memcpy(before, P.cls_granted, sizeof before);
        if (P.late) remainder_lateness(&P, capped);
        else
            for (uint32_t l = capped ? 1 : 0; l < P.lanes && P.n < budget; l++) lane_take(&P, l, budget);
        /* 5. commit: the floor classes' grants from the remainder against their credit (the
         * rows were granted as they were taken; the lanes' bookkeeping follows the pass) */
        for (uint32_t cls = 1; cls < RL_CLASSES; cls++)
            if (p->min_share[cls] > 0) credit_absorb(s, cls, P.cls_granted[cls] - before[cls]);
    }
    if (P.nnotes || (P.granted_any && !P.lease_noted)) notes_flush(&P);
    floors_raise(&P);
    tls_reads += P.reads;
    if (atomic_load_explicit(&s->h->repair_needed, memory_order_relaxed)) P.advice |= RL_ADVISE_REAP;
    if ((P.advice & RL_ADVISE_COMPACT) && rl_merge_running(s)) P.advice &= ~RL_ADVISE_COMPACT;
    if (advice) *advice = P.advice;
    return (int)P.n;
}

int64_t rl_claim_req(const rl_req *r, int64_t now_ms, uint32_t offset) {
    uint32_t advice = 0;
    int n = rl_claim(r->s, r->owner, r->budget, now_ms, r->lease_ms, r->window, r->arena + offset,
                     &advice);
    return n < 0 ? n : (int64_t)n | (int64_t)advice << 32;
}

int64_t rl_complete_claim_req(const rl_req *r, uint32_t n, const int64_t *rows,
                              const int64_t *tokens, int64_t now_ms, uint8_t *ok, uint32_t offset) {
    int64_t done = n ? rl_complete_req(r, n, rows, tokens, now_ms, ok) : 0;
    if (done < 0) return done;
    int64_t got = rl_claim_req(r, now_ms, offset);
    return got < 0 ? got : got | (done >> 32) << 32;
}
