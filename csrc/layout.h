/* The segment layout, private to the C core.
 *
 * One named POSIX shared-memory object per engine:
 *
 *   [header page]          rl_header: magic, version, every size and offset, ready flag,
 *                          then the hot shared words, each on its own 64-byte line
 *   [lanes]                RL_MAX_LANES x rl_lane (floor word, ring minimum, counters)
 *   [owners]               RL_MAX_OWNERS x rl_owner
 *   [rows]                 row_capacity x rl_row (16 bytes: row word, lease word)
 *   [intervals]            row_capacity x uint32 (seconds)
 *   [index 0] [index 1]    two generations of (key uint64[cap], row uint32[cap])
 *   [ring]                 ring_capacity x rl_ring_slot: recent writes not yet merged
 *
 * RL_LAYOUT_VERSION (csrc/lanes.h) must be bumped by any change to a struct in this file, to
 * the order of the regions, or to the meaning of a word (the key, lease or meta packing). An
 * attacher compares the version and recomputes every offset from the sizes; any difference is
 * RL_E_LAYOUT, so no process ever reads a view with shifted offsets.
 */
#ifndef RL_LAYOUT_H
#define RL_LAYOUT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "lanes.h"

#define RL_MAGIC 0x314E414C5F4C5252ULL /* "RRL_LAN1" little-endian */
#define RL_LINE 64
#define RL_KEY_BITS 49
#define RL_KEY_MASK ((1ULL << RL_KEY_BITS) - 1)
#define RL_KEY_NONE RL_KEY_MASK /* lane 127: above every real key, and "not queued" in a row */
#define RL_STRIDE (1ULL << 42)
/* An index key with this bit set is a tombstone: a claim pass granted its row from there, or
 * read it stale or held in flight (csrc/claim.c, rl_index_tomb). Readers skip it without
 * touching the row; comparisons mask it off, so the array stays sorted. */
#define RL_TOMB (1ULL << 63)
/* A tombstone's row field is free: a pass that walked a run of tombstones stores the run's length
 * there (RL_JUMP | length), so later passes cross the run in one step. Tombstones stay
 * tombstones for the life of their generation, so a jump never skips a live entry. */
#define RL_JUMP (1u << 31)
#define RL_HORIZON (RL_STRIDE - 1)

/* ---- lease word: [expiry_ms:42][owner:10][tok:12]; owner 0 = free ----
 * The whole word is the fencing token handed to the caller: it changes on every grant (tok
 * counts grants of the row, expiry and owner differ between holders), and one CAS on it takes,
 * renews or ends a lease, so a stale token can never change a row. */
#define RL_TOK_BITS 12
#define RL_OWNER_BITS 10
#define RL_LEASE_OWNER(w) ((uint32_t)(((w) >> RL_TOK_BITS) & ((1u << RL_OWNER_BITS) - 1)))
#define RL_LEASE_TOK(w) ((uint32_t)((w) & ((1u << RL_TOK_BITS) - 1)))
#define RL_LEASE_EXPIRY(w) ((int64_t)((w) >> (RL_TOK_BITS + RL_OWNER_BITS)))
#define RL_LEASE_MAKE(exp, owner, tok)                                                        \
    (((uint64_t)(exp) << (RL_TOK_BITS + RL_OWNER_BITS)) | ((uint64_t)(owner) << RL_TOK_BITS) | \
     ((uint64_t)(tok) & ((1u << RL_TOK_BITS) - 1)))
#define RL_LEASE_FREE(w) (RL_LEASE_MAKE(0, 0, RL_LEASE_TOK(w)))

/* The token a caller holds is the lease word mixed with its row, so tokens of one batch differ
 * from each other too (an opaque 64-bit value; any bit pattern, carried as int64). */
static inline uint64_t rl_token_mask(uint32_t row) { return ((uint64_t)row + 1) * 0x9E3779B97F4A7C15ULL; }

/* ---- row word: [iv class:2][gone:1][void:1][flight:1][urgent:1][prov:1][failures:8][key:49] ----
 * The key (lane:7, due_ms:42) and the inputs its lane is derived from change together in one
 * store, so a reader never sees a key with another write's failure count. RL_KEY_NONE in the
 * key bits means "not queued". The interval lives in its own uint32 array (written at add).
 *
 * IV CLASS: 1 to 3 names the slot of the key's lane's interval table (rl_lane.iv_cls) that holds
 * the row's interval, 0 none (the table was full, or the row is not queued). Written with the
 * key by every store of one (rl_word_make), the slot filled before: a lateness pass weighs a
 * head by its interval from the row word it has read anyway, not from the intervals array, a
 * random cache line of its own (csrc/claim.c, head_interval).
 *
 * FLIGHT: the row was granted and taken out of the index (its entry tombstoned, a ring entry of
 * it ignored): while its lease is held, no pass needs to find it, and whatever ends the lease
 * puts it back (complete and fail store a new word, which clears the bit; release and the lease
 * sweep clear it, then append its key to the ring again). See csrc/sweep.c. */
#define RL_WORD_KEY(w) ((w) & RL_KEY_MASK)
#define RL_WORD_FAILURES(w) ((uint32_t)(((w) >> 49) & 0xFFu))
#define RL_WORD_PROV(w) ((uint32_t)(((w) >> 57) & 1u))
#define RL_WORD_URGENT(w) ((uint32_t)(((w) >> 58) & 1u))
#define RL_WORD_FLIGHT (1ULL << 59)
/* A fresh row's word is exactly RL_KEY_NONE: reserved by an add (or not yet handed out) and not
 * written. VOID: a reserved row whose writer died before writing it, taken back by a repair (not
 * counted in the rows; csrc/writes.c, rl_reserved_settle). GONE: removed (rl_remove), so a
 * removed row never looks fresh. Both keep the key RL_KEY_NONE: "not queued". */
#define RL_WORD_VOID (1ULL << 60)
#define RL_WORD_GONE (1ULL << 61)
#define RL_IV_CLASSES 3 /* the classes a row word's two bits can name besides 0 */
#define RL_WORD_CLS_SHIFT 62
#define RL_WORD_CLS(w) ((uint32_t)((w) >> RL_WORD_CLS_SHIFT))
#define RL_WORD_CLS_MASK (3ULL << RL_WORD_CLS_SHIFT)
/* A word with no interval class: one that is not queued, or to be given one (rl_word_make). */
#define RL_WORD_MAKE(key, failures, prov, urgent)                                        \
    ((uint64_t)(key) | ((uint64_t)((failures) > 255 ? 255 : (failures)) << 49) |        \
     ((uint64_t)(prov) << 57) | ((uint64_t)(urgent) << 58))

/* ---- ring_min word: [version:15][key:49] ----
 * The lowest key a lane appended to the ring since the last merge (RL_KEY_NONE: none). Every
 * note moves the version, lowered or not, so the merge's reset (a CAS on the whole word read
 * before it looked at the ring) fails if any write noted in between: without the version, a
 * write that did not lower the key slipped past the reset and its row could be stranded below a
 * raised floor (found by the spin model, tests/model/floor.pml). */
#define RL_RMIN_KEY(w) ((w) & RL_KEY_MASK)
#define RL_RMIN_MAKE(ver, key) ((((uint64_t)(ver) & 0x7FFFu) << RL_KEY_BITS) | (key))
#define RL_RMIN_NEXT(w, key) RL_RMIN_MAKE(((w) >> RL_KEY_BITS) + 1u, (key))

/* ---- lease_min word: [sweeping:1][version:21][ms:42] ----
 * A lower bound on the expiry of every lease that holds a FLIGHT row, so a pass knows, with one
 * load, whether some taken-out row may have become claimable (then it sweeps, csrc/sweep.c).
 * Grants and renewals lower it; marking an owner dead sets it to 0. While a sweep runs the ms
 * field collects the notes made meanwhile, and the sweep's end folds its own minimum into it:
 * every change moves the version, so no note is lost to the sweep's store. */
#define RL_LMIN_SWEEPING (1ULL << 63)
#define RL_LMIN_MS(w) ((int64_t)((w) & RL_HORIZON))
#define RL_LMIN_NEXT(w, sweeping, ms)                                                           \
    (((sweeping) ? RL_LMIN_SWEEPING : 0) | ((((w) >> 42) + 1u) & 0x1FFFFFu) << 42 |             \
     ((uint64_t)(ms) & RL_HORIZON))

/* ---- floor word: [minute:32][epoch:32] ---- */
#define RL_FLOOR_MINUTE(w) ((uint32_t)((w) >> 32))
#define RL_FLOOR_EPOCH(w) ((uint32_t)(w))
#define RL_FLOOR_MAKE(minute, epoch) (((uint64_t)(minute) << 32) | (uint32_t)(epoch))

/* Owner slot states. */
#define RL_OWNER_FREE 0
#define RL_OWNER_CLAIMING 1
#define RL_OWNER_ALIVE 2
#define RL_OWNER_DEAD 3

typedef struct {
    _Atomic uint64_t word;  /* see the row word above: key plus failures and flags */
    _Atomic uint64_t lease; /* see the lease word above */
} rl_row;
_Static_assert(sizeof(rl_row) == 16, "row is 16 bytes: four to a cache line");

/* A ring slot's state names the position it was last written for, modulo 2^30, so a reader
 * tells a slot published for position p from one reused for p + capacity. */
#define RL_SLOT(pos, flag) ((uint32_t)((uint64_t)(pos) * 4u + (flag)))
typedef struct {
    _Atomic uint32_t state; /* RL_SLOT(position, 1 published | 2 abandoned) */
    _Atomic uint32_t row;
    _Atomic uint64_t key;
} rl_ring_slot;
_Static_assert(sizeof(rl_ring_slot) == 16, "ring slot is 16 bytes");

typedef struct {
    _Alignas(RL_LINE) _Atomic uint64_t floor; /* [minute:32][epoch:32], see csrc/floor.c */
    /* The lowest interval (s) of any row ever published into the lane, 0 before the first:
     * only ever lowered (rl_publish, before the row is visible), so every row of the lane has
     * an interval >= it. With the floor it bounds the lane head's relative lateness, so
     * remainder = lateness leaves unopened a lane that cannot win (csrc/claim.c). Beside the
     * floor, which every write into the lane touches anyway. */
    _Atomic uint32_t iv_min;
    _Atomic uint32_t iv_max; /* the highest, only ever raised: a head's lateness is at least
                              * weight x (now - due) / iv_max, so a pass can grant without
                              * reading the head's interval while that already wins */
    /* The same of the rows published into the lane since its bands took effect (rl_policy_set
     * clears them when ttl_bands or lanes_enabled change): what weights_live weighs the lane by,
     * so a move to other bands is not weighed by the rows of the old ones. 0 0: none yet. */
    _Atomic uint32_t wv_min;
    _Atomic uint32_t wv_max;
    /* The lane's interval table: each slot 0 (free) until a writer fills it with an interval,
     * once, by CAS, before it stores a row word naming it (rl_iv_class); never changed after.
     * A row word's class c > 0 names slot c - 1 of its key's lane. */
    _Atomic uint32_t iv_cls[RL_IV_CLASSES];
    char pad0[RL_LINE - 24 - 4 * RL_IV_CLASSES];
    _Alignas(RL_LINE) _Atomic uint64_t ring_min; /* [version:15][key:49], see below */
    char pad1[RL_LINE - 8];
    _Alignas(RL_LINE) _Atomic uint64_t granted;
    _Atomic uint64_t spilled;
    _Atomic uint64_t stale_skipped;
    _Atomic uint64_t lease_refused;
    char pad2[RL_LINE - 32];
    /* [index generation:32][position:32]: in that generation, every entry of this lane before
     * `position` is stale, in flight, or below the floor minute some pass read when it moved the
     * hint; skip_floor, [generation:32][minute:32], is the highest such minute (raised before the
     * hint moves, read after it), so a pass whose floor is lower (a write lowered it since)
     * seeks instead (csrc/claim.c; found by the spin model, tests/model/floor.pml). */
    _Alignas(RL_LINE) _Atomic uint64_t skip;
    _Atomic uint64_t skip_floor;
    char pad3[RL_LINE - 16];
    /* The ring's skip hint, [index generation:32][ring position mod 2^32] (rebuilt against
     * ring_tail: the ring spans less than 2^31): in that generation (ring_head moves only when
     * it does), every ring entry of this lane before the position is
     * stale, FLIGHT-held, granted, or not due before key `ring_low` (the lowest such key a pass
     * stepped over; reset by the merge before it publishes). A pass starts its ring scan there
     * while ring_low is not due, so releases and other due writes are read once, not by every
     * pass until the next merge (csrc/claim.c, ring_collect). */
    _Alignas(RL_LINE) _Atomic uint64_t ring_skip;
    _Atomic uint64_t ring_low;
    char pad4[RL_LINE - 16];
} rl_lane;
_Static_assert(sizeof(rl_lane) == 5 * RL_LINE, "lane is five cache lines");
_Static_assert(offsetof(rl_lane, ring_skip) % RL_LINE == 0, "ring hint on its own line");
_Static_assert(offsetof(rl_lane, skip) % RL_LINE == 0, "skip hint on its own line");
_Static_assert(offsetof(rl_lane, floor) % RL_LINE == 0, "floor word on its own line");
_Static_assert(offsetof(rl_lane, ring_min) % RL_LINE == 0, "ring minimum on its own line");
_Static_assert(offsetof(rl_lane, granted) % RL_LINE == 0, "counters on their own line");

/* Owner state word: [registration:32][RL_OWNER_*:32]. Every registration bumps the first
 * half, so marking an owner dead is a CAS against the exact registration that was found dead:
 * a slot freed and taken by a new process meanwhile is never marked dead by mistake. */
#define RL_OWNER_STATE(w) ((uint32_t)(w))
#define RL_OWNER_REG(w) ((uint32_t)((w) >> 32))
#define RL_OWNER_WORD(reg, st) (((uint64_t)(reg) << 32) | (uint32_t)(st))
/* The write journal: each owner has RL_OWNER_WRITES slots, one per thread of it inside an
 * unleased write, naming the rows that write may leave half done, [first:32][n:32] (0: free).
 * An add stores [first, n) before its CAS on rows_used and clears it after publishing; a repair
 * takes back a reserved row never written only where no live owner's journal covers it, and
 * verify() calls a row a dead owner's journal covers a crash mark, not a violation
 * (csrc/writes.c; the spin model tests/model/add.pml). */
#define RL_OWNER_WRITES 4
#define RL_JOURNAL(first, n) (((uint64_t)(first) << 32) | (uint32_t)(n))
#define RL_JOURNAL_FIRST(w) ((uint32_t)((w) >> 32))
#define RL_JOURNAL_N(w) ((uint32_t)(w))
static inline int rl_journal_covers(uint64_t w, uint32_t row) {
    return w != 0 && row >= RL_JOURNAL_FIRST(w) && row - RL_JOURNAL_FIRST(w) < RL_JOURNAL_N(w);
}

/* Three lines per owner. The first is read by claimers that meet the owner's leases; the
 * second holds its liveness beacon, a robust process-shared mutex that the registering thread
 * keeps locked and the kernel marks "owner died" when that thread ends (csrc/lease.c); the
 * third, the hazard and the write journal, is written by the owner itself (twice per completed
 * batch, twice per unleased write) and read by merges and repairs. */
typedef struct {
    _Alignas(RL_LINE) _Atomic uint64_t state; /* see the owner state word above */
    _Atomic uint32_t pid;
    _Atomic uint32_t beacon_tid;  /* the thread holding `beacon`, 0: no beacon */
    _Atomic uint64_t start_time;  /* process start time (ms since epoch, from psutil) */
    _Alignas(RL_LINE) pthread_mutex_t beacon;
    _Alignas(RL_LINE) _Atomic uint64_t hazard; /* [index generation + 1 : 44][threads in it : 20] */
    _Atomic uint64_t writes[RL_OWNER_WRITES];  /* the write journal, see above */
} rl_owner;
_Static_assert(sizeof(rl_owner) == 3 * RL_LINE, "owner: three lines");
_Static_assert(sizeof(pthread_mutex_t) <= RL_LINE, "the beacon fits its line");

typedef struct {
    _Alignas(RL_LINE) _Atomic int64_t credit; /* share credit in RL_ONE units, see claim.c */
    char pad[RL_LINE - 8];
} rl_class_credit;
_Static_assert(sizeof(rl_class_credit) == RL_LINE, "one credit per line");

typedef struct {
    _Atomic uint32_t seq; /* odd while being written */
    uint32_t pad;
    rl_policy p;
} rl_policy_slot;

/* The segment's header: its identity (checked by every attacher), then the shared words every
 * process reads and writes, each hot one on a line of its own. */
typedef struct {
    /* --- identity: written once by the creator before `ready` --- */
    uint64_t magic;           /* RL_MAGIC: a segment that is not ours is refused at once */
    uint32_t layout_version;  /* RL_LAYOUT_VERSION of the build that created it */
    uint32_t header_bytes;    /* sizeof(rl_header) of that build */
    uint64_t total_bytes;     /* the whole segment */
    uint32_t max_lanes;       /* RL_MAX_LANES of that build */
    uint32_t max_owners;      /* RL_MAX_OWNERS of that build */
    uint32_t row_capacity;    /* rows (and entries per index buffer) */
    uint32_t ring_capacity;   /* slots of the recent-write ring */
    uint64_t off_lanes;       /* byte offsets of the regions (all computed from the two */
    uint64_t off_owners;      /*  capacities: an attacher recomputes and compares them) */
    uint64_t off_rows;
    uint64_t off_intervals;
    uint64_t off_index_keys[2];
    uint64_t off_index_rows[2];
    uint64_t off_ring;
    uint64_t created_ms;      /* wall clock at create */
    uint64_t identity_sum;    /* FNV-1a of every field above: a changed size cannot pass */
    _Atomic uint32_t ready;   /* published last; attachers wait for it */
    uint32_t pad0;

    /* --- hot words, one line each --- */
    _Alignas(RL_LINE) _Atomic uint64_t index_gen;      /* active generation; buffer = gen & 1 */
    _Alignas(RL_LINE) _Atomic uint64_t ring_head;      /* first ring position not yet merged */
    _Alignas(RL_LINE) _Atomic uint64_t ring_tail;      /* next ring position to reserve */
    _Alignas(RL_LINE) _Atomic uint32_t rows_used;      /* row ids handed out: [0, rows_used) */
    _Atomic uint32_t rows_void;                        /* of which taken back (RL_WORD_VOID) */
    _Alignas(RL_LINE) _Atomic uint64_t compactor;      /* owner id holding the merge, 0 = none */
    _Alignas(RL_LINE) _Atomic uint64_t policy_version; /* active policy slot = version & 1 */
    _Atomic uint64_t wv_epoch; /* bumped when a lane's wv bounds move: a pass derives the weights
                                * again only then (csrc/claim.c lane_weights) */
    _Alignas(RL_LINE) _Atomic uint32_t repair_needed;  /* 1: a pass advises RL_ADVISE_REAP */
    _Alignas(RL_LINE) _Atomic uint32_t lanes_high; /* highest lane ever written: passes stop there */
    _Atomic uint64_t lanes_used; /* bit l: lane l's iv_max is set (a row was ever put in it) */
    _Alignas(RL_LINE) _Atomic uint64_t lease_min;  /* see the lease_min word above */
    _Alignas(RL_LINE) _Atomic uint64_t sweeper;    /* owner running the sweep (while sweeping) */
    _Atomic int64_t owners_check_ns; /* CLOCK_MONOTONIC time of the next owner liveness check */
    _Atomic uint32_t owners_high;    /* highest owner slot ever registered: checks stop there */
    _Atomic int64_t sweep_after_ns;  /* CLOCK_MONOTONIC time before which no sweep starts */
    _Alignas(RL_LINE) rl_class_credit credit[RL_CLASSES]; /* share credit per class (claim.c) */

    /* --- per index generation: entry count and lane starts, written before the gen flips --- */
    _Alignas(RL_LINE) _Atomic uint32_t index_count[2];      /* entries in each buffer */
    _Atomic uint32_t lane_start[2][RL_MAX_LANES + 1];       /* first position of each lane */

    rl_policy_slot policy[2]; /* the policy, double-buffered (segment.c, rl_policy_read) */
} rl_header;

_Static_assert(offsetof(rl_header, index_gen) % RL_LINE == 0, "index_gen on its own line");
_Static_assert(offsetof(rl_header, ring_head) % RL_LINE == 0, "ring_head on its own line");
_Static_assert(offsetof(rl_header, ring_tail) % RL_LINE == 0, "ring_tail on its own line");
_Static_assert(offsetof(rl_header, credit) % RL_LINE == 0, "credits on their own lines");
_Static_assert(offsetof(rl_header, lease_min) % RL_LINE == 0, "lease_min on its own line");
_Static_assert(RL_MAX_LANES == 2 * RL_MAX_BANDS + 4, "lanes fit the widest band list");

/* One process's view of a mapped segment. */
struct rl_seg {
    rl_header *h;
    uint8_t *base;
    uint64_t bytes;
    rl_lane *lanes;
    rl_owner *owners;
    rl_row *rows;
    _Atomic uint32_t *intervals;
    _Atomic uint64_t *ikeys[2];
    _Atomic uint32_t *irows[2];
    rl_ring_slot *ring;
    uint64_t serial; /* unique per handle in this process: keys the per-thread caches, which a
                      * reused rl_seg address must not inherit */
    uint32_t registered; /* the owner slot registered through this handle, 0: none */
    uint32_t beacon_tid; /* the thread of this process that locked that slot's beacon through this
                          * mapping, 0: none (this process's own record: others may rewrite the
                          * slot's once it is free) */
    uint32_t beacon_pid; /* the process it belongs to (a forked child's copy of the handle is not) */
    char name[256];
};
uint64_t rl_next_serial(void); /* segment.c */

/* Whether a merge runs now. Claims and writes then do not advise one: each would only find it
 * busy (thousands of calls per merge with two workers). A merge whose holder died is taken
 * over by the next writer that finds the ring full, or by a repair. */
static inline int rl_merge_running(rl_seg *s) {
    return atomic_load_explicit(&s->h->compactor, memory_order_relaxed) != 0;
}

/* An owner's hazard (csrc/index.c): the generation its threads are marking tombstones or jumps
 * in, and how many are. Threads of one process share the owner, so entering counts in and
 * leaving counts out; a thread that finds the others in another generation skips its marks,
 * which are only hints. (A single word once meant the first thread to leave cleared the
 * hazard of another still marking.) */
#define RL_HZ_SHIFT 20
#define RL_HZ_COUNT ((1ULL << RL_HZ_SHIFT) - 1)
static inline int rl_hazard_enter(_Atomic uint64_t *hz, uint64_t gen) {
    uint64_t w = atomic_load(hz), mine = (gen + 1) << RL_HZ_SHIFT;
    for (;;) {
        uint64_t n = w & RL_HZ_COUNT;
        if (n != 0 && (w & ~RL_HZ_COUNT) != mine) return 0;
        if (n == RL_HZ_COUNT) return 0;
        if (atomic_compare_exchange_weak(hz, &w, n ? w + 1 : mine | 1)) return 1;
    }
}
static inline void rl_hazard_leave(_Atomic uint64_t *hz) {
    atomic_fetch_sub_explicit(hz, 1, memory_order_release);
}
/* Whether some thread of the owner marks in generation `gen`. */
static inline int rl_hazard_in(uint64_t w, uint64_t gen) {
    return (w & RL_HZ_COUNT) != 0 && (w >> RL_HZ_SHIFT) == gen + 1;
}

/* Prefetch a row's line for writing where the CPU can (PREFETCHW, checked once by CPUID in
 * segment.c; x86 CPUs without it are not promised to ignore it): the CAS that follows then
 * finds the line already owned, instead of fetching it from the other core's cache while the
 * lock waits. With two processes at the head of one lane this took the sharing cost from about
 * 0.7x to 0.8x of two processes on separate engines. */
extern int rl_cpu_prefetchw;
static inline void rl_prefetch_w(const void *p) {
#if defined(__x86_64__) || defined(__i386__)
    if (rl_cpu_prefetchw) {
        __asm__ volatile("prefetchw %0" : : "m"(*(const char *)p));
        return;
    }
    __builtin_prefetch(p, 0, 3);
#else
    __builtin_prefetch(p, 1, 3);
#endif
}

/* ---- helpers shared between the C files ---- */

static inline void rl_lease_min_note(rl_seg *s, int64_t expiry);

/* After freeing a row's lease word: a grant that lost the lease before it set FLIGHT (it read
 * the word, was overtaken, and set the flag on a row it no longer holds) leaves FLIGHT on a row
 * whose lease is free, which no pass would find and no sweep would be due for. So whoever frees
 * a lease looks at the flag afterwards and, if set, makes the next pass sweep (found by the spin
 * model, tests/model/floor.pml, NO_END_RECHECK). */
static inline void rl_lease_freed(rl_seg *s, uint32_t row) {
    if (atomic_load(&s->rows[row].word) & RL_WORD_FLIGHT) rl_lease_min_note(s, 0);
}

/* Lower lease_min to `expiry` (grants, renewals; 0 when an owner is found dead): see
 * csrc/sweep.c. */
static inline void rl_lease_min_note(rl_seg *s, int64_t expiry) {
    _Atomic uint64_t *w = &s->h->lease_min;
    uint64_t cur = atomic_load(w);
    if (expiry < 0) expiry = 0;
    while (expiry < RL_LMIN_MS(cur) &&
           !atomic_compare_exchange_weak(w, &cur, RL_LMIN_NEXT(cur, cur & RL_LMIN_SWEEPING, expiry)))
        ;
}

static inline uint64_t rl_row_key(rl_seg *s, uint32_t row) {
    return RL_WORD_KEY(atomic_load_explicit(&s->rows[row].word, memory_order_acquire));
}
static inline uint32_t rl_minute(uint64_t due_ms) { return (uint32_t)(due_ms / 60000u); }
static inline uint32_t rl_key_lane(uint64_t key) { return (uint32_t)(key >> 42); }
static inline uint64_t rl_key_due(uint64_t key) { return key & (RL_STRIDE - 1); }

/* Widen the bounds [*lo, *hi] to take iv (0 0: none yet); only ever outward. Whether they
 * moved. */
static inline int rl_bounds_widen(_Atomic uint32_t *lo, _Atomic uint32_t *hi, uint32_t iv) {
    int moved = 0;
    uint32_t cur = atomic_load_explicit(lo, memory_order_relaxed);
    while ((cur == 0 || iv < cur) && !(moved = atomic_compare_exchange_weak(lo, &cur, iv)))
        ;
    cur = atomic_load_explicit(hi, memory_order_relaxed);
    while (iv > cur) {
        if (atomic_compare_exchange_weak(hi, &cur, iv)) {
            moved = 1;
            break;
        }
    }
    return moved;
}

/* Widen lane `lane`'s interval bounds to take `iv` before a row of that interval is visible in
 * the lane: iv_min/iv_max (only ever moved outward) by rl_publish and by a repair's rebuild for
 * the rows a dead writer stored but never published, wv_min/wv_max (the weights' bounds) by
 * rl_publish only (`published`). A lane whose iv_max is 0 therefore never had a row, and a
 * lateness pass leaves it unopened (csrc/claim.c). */
static inline void rl_lane_iv_note(rl_seg *s, uint32_t lane, uint32_t iv, int published) {
    if (iv == 0) iv = 1; /* counts as 1 s (an add refuses 0): iv_max is never 0 past a row */
    if (rl_bounds_widen(&s->lanes[lane].iv_min, &s->lanes[lane].iv_max, iv) &&
        !(atomic_load_explicit(&s->h->lanes_used, memory_order_relaxed) & (1ull << lane)))
        atomic_fetch_or(&s->h->lanes_used, 1ull << lane);
    if (published && rl_bounds_widen(&s->lanes[lane].wv_min, &s->lanes[lane].wv_max, iv))
        atomic_fetch_add(&s->h->wv_epoch, 1);
}

/* The class (1 to RL_IV_CLASSES) of interval iv in lane `lane`: the slot of its table that holds
 * iv, filled now if none does and one is free; 0 when the table is full of other intervals (or
 * iv is 0), and the row is weighed by the intervals array. A slot is filled once by CAS, so two
 * writers filling the same slot with different intervals cannot both win it (the spin model
 * tests/model/ivclass.pml). Call it before storing the word that names the class. */
static inline uint32_t rl_iv_class(rl_seg *s, uint32_t lane, uint32_t iv) {
    _Atomic uint32_t *t = s->lanes[lane].iv_cls;
    if (iv == 0) return 0;
    for (uint32_t i = 0; i < RL_IV_CLASSES; i++) {
        uint32_t cur = atomic_load_explicit(&t[i], memory_order_acquire);
        if (cur == 0 && atomic_compare_exchange_strong(&t[i], &cur, iv)) return i + 1;
        if (cur == iv) return i + 1; /* held, or filled with iv by another writer meanwhile */
    }
    return 0;
}

/* The row word of a queued key (or of RL_KEY_NONE, with no class) of a row of interval iv. */
static inline uint64_t rl_word_make(rl_seg *s, uint64_t key, uint32_t failures, uint32_t prov,
                                    uint32_t urgent, uint32_t iv) {
    uint64_t w = RL_WORD_MAKE(key, failures, prov, urgent);
    if (key == RL_KEY_NONE) return w;
    return w | (uint64_t)rl_iv_class(s, rl_key_lane(key), iv) << RL_WORD_CLS_SHIFT;
}

/* classes: 0 urgent, 1 submitted, 2 discovered, 3 cold (lanes past the layout count as cold) */
static inline uint32_t rl_class_of(const rl_policy *p, uint32_t lane) {
    uint32_t bands = p->band_count + 1;
    if (lane == 0) return 0;
    if (lane <= bands) return 1;
    if (lane <= 2 * bands) return 2;
    return 3;
}

void rl_policy_read(rl_seg *s, rl_policy *out);                    /* segment.c */
const rl_policy *rl_policy_cached(rl_seg *s);                   /* segment.c */
int rl_owner_alive(rl_seg *s, uint32_t owner, uint8_t *memo);      /* owners.c */
int rl_beacon_init(rl_owner *owner);                                /* owners.c */
void rl_beacon_take(rl_seg *s, uint32_t owner);                     /* owners.c */
void rl_beacon_drop(rl_seg *s);                                     /* owners.c */
int rl_beacon_unmappable(rl_seg *s);                                /* owners.c */
void rl_owner_unregister(rl_seg *s, uint32_t owner);                /* owners.c */
void rl_owners_check(rl_seg *s);                                    /* owners.c */
int rl_lease_claimable(rl_seg *s, uint64_t word, int64_t now_ms, uint8_t *memo); /* lease.c */
void rl_floor_lower(rl_seg *s, uint32_t lane, uint32_t minute);    /* floor.c */
int rl_floor_raise(rl_seg *s, uint32_t lane, uint64_t seen_word, uint32_t minute); /* floor.c */
void rl_floor_bump_all(rl_seg *s);                                 /* floor.c */
int rl_ring_append(rl_seg *s, uint32_t owner, uint32_t n, const uint64_t *keys,
                   const uint32_t *rows, uint32_t *advice);         /* index.c */
void rl_ring_min_note(rl_seg *s, uint64_t key);                    /* index.c */
void rl_index_tomb(rl_seg *s, uint32_t owner, uint64_t gen, uint32_t n, const uint32_t *poss,
                   const uint64_t *keys);                            /* index.c */
int rl_publish(rl_seg *s, uint32_t owner, uint32_t n, const uint64_t *keys, const uint32_t *rows,
               int derived, uint32_t *advice);                      /* writes.c */
int rl_flight_return(rl_seg *s, uint32_t owner, uint32_t n, const uint32_t *rows,
                     const uint64_t *words, uint32_t *advice);      /* writes.c */
void rl_sweep_if_due(rl_seg *s, uint32_t owner, int64_t now_ms);   /* sweep.c */
int64_t rl_now_ms(void);                                           /* segment.c */
int rl_compact_locked(rl_seg *s, int full_rebuild, uint32_t *lane_min); /* index.c */
int rl_compactor_acquire(rl_seg *s, uint32_t owner);               /* index.c */
int rl_owner_live(rl_seg *s, uint32_t owner);                      /* owners.c */
void rl_reserved_settle(rl_seg *s, uint32_t used, rl_repair_out *out); /* writes.c */
void rl_compactor_release(rl_seg *s, uint32_t owner);              /* index.c */

#endif
