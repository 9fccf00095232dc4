/* render-lanes C core: the public C API, and the cffi cdef source.
 *
 * engine/_build.py feeds this file to ffi.cdef() after dropping the preprocessor lines
 * marked CDEF-SKIP, so keep it to plain declarations and `#define NAME integer`. The layout of
 * the segment itself is private to the C files (csrc/layout.h).
 */
#ifndef RL_LANES_H /* CDEF-SKIP */
#define RL_LANES_H /* CDEF-SKIP */
#include <stdint.h> /* CDEF-SKIP */

/* Status codes. engine/errors.py maps each one to an exception; keep the two in step. */
#define RL_OK 0
#define RL_E_LAYOUT -1
#define RL_E_LEASE -2
#define RL_E_CAPACITY -3
#define RL_E_VALUE -4
#define RL_E_RANGE -5
#define RL_E_SYS -6
#define RL_E_TIMEOUT -7
#define RL_E_EXISTS -8
#define RL_E_NOTFOUND -9
#define RL_E_NOTALLOWED -10
#define RL_E_BUSY -11

/* Bump on any change to csrc/layout.h (a struct, the region order, the row/lease/floor word
 * packing): attachers refuse a segment of another version with RL_E_LAYOUT. */
#define RL_LAYOUT_VERSION 16
#define RL_MAX_LANES 64
#define RL_MAX_BANDS 30
#define RL_MAX_OWNERS 1024
#define RL_CLASSES 4
#define RL_ONE 65536

/* rl_policy.remainder: lane order; global due time (EDF); the lane head latest relative to its
 * interval, times the lane's weight (csrc/claim.c, remainder_lateness). */
#define RL_REMAINDER_LANE_ORDER 0
#define RL_REMAINDER_EDF 1
#define RL_REMAINDER_LATENESS 2
/* Lane weights lie in [1, RL_WEIGHT_MAX] (RL_ONE = 1.0): 1/1000 .. 1000 as the caller gives them. */
#define RL_WEIGHT_MAX 65536000
/* Weights derived from the lanes' interval bounds (rl_policy.weights_live; engine.policy
 * interval_weights_fp): a band lane weighs (iv_max / iv_min) ** (RL_SPREAD_NUM / RL_SPREAD_DEN),
 * times RL_FIRST_BAND_WEIGHT when it holds the shortest interval of the band lanes. */
#define RL_SPREAD_NUM 3
#define RL_SPREAD_DEN 16
#define RL_FIRST_BAND_WEIGHT 4
/* A failed row backs off 30 s doubling per failure, to at most its interval; in the cold lane,
 * its interval doubling per further failure, at most this many times (up to 8 intervals;
 * engine.policy.COLD_BACKOFF_DOUBLINGS; csrc/writes.c rl_fail). */
#define RL_COLD_BACKOFF_DOUBLINGS 3

/* Flags a claim pass reports back (rl_claim's *advice). */
#define RL_ADVISE_COMPACT 1
#define RL_ADVISE_REAP 2

/* Row provenance codes. */
#define RL_PROV_SUBMITTED 0
#define RL_PROV_DISCOVERED 1

typedef struct rl_seg rl_seg; /* one process's handle on a mapped segment */

/* The policy as the segment stores it. Shares in RL_ONE fixed point. */
typedef struct {
    uint32_t band_count;              /* number of band boundaries n (lanes = 2n + 4) */
    uint32_t bands[30];               /* boundaries in seconds, ascending */
    uint32_t cold_after;
    uint32_t urgent_share;            /* RL_ONE = uncapped */
    uint32_t min_share[4];            /* indexed by class: 0 urgent (unused), 1 submitted, 2 discovered, 3 cold */
    uint32_t remainder;               /* RL_REMAINDER_*: how the grants floors leave are served */
    uint32_t lanes_enabled;
    uint32_t weights_live;            /* 1: weight[] unused, derived at every pass (claim.c) */
    double urgent_share_exact;        /* the shares as the caller gave them, for reading back */
    double min_share_exact[4];
    uint32_t weight[64];              /* per lane, RL_ONE = 1.0: scales its relative lateness */
    double weight_exact[64];          /* the weights as the caller gave them, for reading back */
} rl_policy;

typedef struct {
    uint64_t magic;
    uint32_t layout_version;
    uint32_t max_lanes;
    uint64_t total_bytes;
    uint32_t row_capacity;
    uint32_t ring_capacity;
    uint32_t rows_used;
    uint32_t rows_void;       /* of rows_used, reserved rows a repair took back (never written) */
    uint32_t index_count;
    uint64_t index_gen;
    uint64_t ring_head;
    uint64_t ring_tail;
    uint64_t created_ms;
} rl_info;

typedef struct {
    uint64_t floor_word;      /* minute << 32 | epoch */
    uint64_t ring_min;        /* lowest key appended to the ring since the last merge */
    uint64_t granted;
    uint64_t spilled;
    uint64_t stale_skipped;
    uint64_t lease_refused;
    uint64_t queued;          /* filled by rl_stats (row walk) */
    uint64_t due;
    uint64_t leased;
    uint64_t in_flight;       /* taken out of the index while leased (FLIGHT) */
    uint32_t iv_min;          /* the lowest and highest interval (s) of the rows written into the */
    uint32_t iv_max;          /* lane since its bands took effect (its wv_min, wv_max); 0: none */
} rl_lane_stats;

typedef struct {
    int32_t code;     /* RL_V_* below */
    uint32_t row;
    uint32_t lane;
    uint64_t detail;
} rl_problem;

#define RL_V_BELOW_FLOOR 1
#define RL_V_NOT_FINDABLE 2
#define RL_V_INDEX_ORDER 3
#define RL_V_INDEX_ROW 4
#define RL_V_UNKNOWN_OWNER 5
#define RL_V_BAD_KEY 6
#define RL_V_LANE_START 7
#define RL_V_HEADER 8
#define RL_V_RING_MIN 9
#define RL_V_LEASE_UNCOVERED 10
#define RL_V_IV_CLASS 13 /* a row word's interval class names no slot holding its interval */
/* Crash marks, not violations: what a writer killed midway left, which the next repair (reap(),
 * a claim pass's, `lanes check --repair`) finishes or takes back. detail: the dead owner. */
#define RL_V_DEAD_WRITE 11    /* a queued row its dead writer stored but did not publish */
#define RL_V_ABANDONED 12     /* a reserved row whose writer died before writing it */

typedef struct {
    uint32_t row;
    uint32_t lane;
    int64_t due_ms;
    uint64_t key;
    uint64_t lease;
    int64_t lease_expiry_ms;  /* -1 when not leased */
    uint32_t lease_owner;
    uint32_t interval_s;
    uint32_t failures;
    uint32_t provenance;
    uint32_t urgent;
    uint32_t queued;
} rl_row_info;

/* ---- keys (the C mirror of engine/keys.py) ---- */
uint64_t rl_encode(uint32_t lane, uint64_t due_ms);
uint32_t rl_lane_for(const rl_policy *p, uint32_t provenance, uint32_t interval_s,
                     uint32_t failures, int urgent);

/* ---- segment: create / attach / close ---- */
int rl_segment_size(uint32_t row_capacity, uint32_t ring_capacity, uint64_t *bytes);
int rl_create(const char *name, uint32_t row_capacity, uint32_t ring_capacity,
              const rl_policy *policy, int64_t now_ms, rl_seg **out);
int rl_attach(const char *name, double timeout_s, rl_seg **out);
void rl_close(rl_seg *s);
int rl_unlink(const char *name);
int rl_info_get(rl_seg *s, rl_info *out);
int rl_layout_check(const void *base, uint64_t bytes);   /* 0 when `base` holds our layout */
int rl_prefault(rl_seg *s);   /* map every page now (attach, create, first use after a fork) */

/* ---- owners ---- */
int rl_owner_register(rl_seg *s, uint32_t pid, uint64_t start_time, uint32_t *owner);
int rl_owner_release(rl_seg *s, uint32_t owner);
/* `state` is the owner state word ([registration:32][state:32]); mark_dead takes the word that
 * was read, so only that registration is marked. */
int rl_owner_get(rl_seg *s, uint32_t owner, uint32_t *pid, uint64_t *start_time, uint64_t *state);
int rl_owner_mark_dead(rl_seg *s, uint32_t owner, uint64_t state);
/* 1 when the owner's registering thread still holds its liveness beacon (alive, known with no
 * system call); 0 when liveness must be asked of the kernel (csrc/lease.c). */
int rl_owner_beacon(rl_seg *s, uint32_t owner);
int rl_repair(rl_seg *s, uint32_t owner, uint32_t *reclaimed);
/* What a repair did: leases of dead owners ended, reserved rows never written taken back, and
 * those left for a later repair because a live owner's write journal still covers them. */
typedef struct {
    uint32_t reclaimed;
    uint32_t voided;
    uint32_t waiting;
    uint32_t pad;
} rl_repair_out;
int rl_repair_report(rl_seg *s, uint32_t owner, rl_repair_out *out);

/* ---- policy ---- */
int rl_policy_get(rl_seg *s, rl_policy *out, uint64_t *version);
int rl_policy_set(rl_seg *s, const rl_policy *p);
int rl_credit_get(rl_seg *s, int64_t *credits);   /* RL_CLASSES values */

/* ---- claim pass ---- */
/* `out` holds 4 * budget values: rows, lanes, due_ms, tokens, each `budget` apart. */
int rl_claim(rl_seg *s, uint32_t owner, uint32_t budget, int64_t now_ms, int64_t lease_ms,
             uint32_t window, int64_t *out, uint32_t *advice);
/* Index entries the calling thread's claim passes have read so far (a diagnostic: how much of
 * the index a pass walks; crossing a marked run of tombstones reads one). */
uint64_t rl_index_reads(void);

/* The hot calls of one process's engine (engine._hot, csrc/hot.c, calls them through function
 * pointers), with the handle and owner in a request block (one per Segment, emptied when it
 * closes; each call fills in its own copy's budget, lease, window and arena) and the advice in
 * the result's high half instead of an out-parameter. Both return a count | advice << 32, or a
 * negative status; they check exactly what rl_claim and rl_complete_many check. */
typedef struct {
    rl_seg *s;
    uint32_t owner;
    uint32_t budget;
    int64_t lease_ms;
    uint32_t window;
    uint32_t pad;
    int64_t *arena;           /* claim results: arena + offset, laid out as rl_claim's `out` */
} rl_req;
int64_t rl_claim_req(const rl_req *r, int64_t now_ms, uint32_t offset);
int64_t rl_complete_req(const rl_req *r, uint32_t n, const int64_t *rows, const int64_t *tokens,
                        int64_t now_ms, uint8_t *ok);
/* complete_req, then (when it succeeded) claim_req at the same now_ms: one call per worker cycle.
 * Returns the claim's count | (both calls' advice) << 32, or the first negative status (a failed
 * completion changes nothing and claims nothing). */
int64_t rl_complete_claim_req(const rl_req *r, uint32_t n, const int64_t *rows,
                              const int64_t *tokens, int64_t now_ms, uint8_t *ok, uint32_t offset);

/* ---- writes ---- */
int rl_add_many(rl_seg *s, uint32_t owner, uint32_t n, const int64_t *due_ms,
                const int64_t *interval_s, const int64_t *provenance, const int64_t *failures,
                int64_t *out_rows, uint32_t *advice);
int rl_complete_many(rl_seg *s, uint32_t owner, uint32_t n, const int64_t *rows,
                     const int64_t *tokens, const int64_t *next_due_ms, int64_t now_ms,
                     uint8_t *ok, uint32_t *advice);
int rl_fail(rl_seg *s, uint32_t owner, uint32_t row, uint64_t token, int64_t retry_at_ms,
            int64_t now_ms, int permanent, uint32_t *advice);
int rl_release_many(rl_seg *s, uint32_t owner, uint32_t n, const int64_t *rows,
                    const int64_t *tokens, uint8_t *ok, uint32_t *advice);
int rl_renew(rl_seg *s, uint32_t owner, uint32_t row, uint64_t token, int64_t now_ms,
             int64_t lease_ms, uint64_t *new_token);
int rl_prioritize(rl_seg *s, uint32_t owner, uint32_t row, int rush, int64_t now_ms,
                  uint32_t *advice);
int rl_remove(rl_seg *s, uint32_t owner, uint32_t row, uint32_t *advice);
int rl_reclassify(rl_seg *s, uint32_t owner, uint32_t row, uint32_t provenance, uint32_t *advice);
int rl_restamp(rl_seg *s, uint32_t owner, uint32_t limit, uint32_t *restamped, uint32_t *remaining);

/* ---- index ---- */
int rl_compact(rl_seg *s, uint32_t owner, int full_rebuild);

/* ---- looking at it ---- */
int rl_row_info_get(rl_seg *s, uint32_t row, int64_t now_ms, rl_row_info *out);
int rl_stats(rl_seg *s, int64_t now_ms, rl_lane_stats *lanes);
int rl_verify(rl_seg *s, rl_problem *out, uint32_t max_out, uint32_t *found);
int rl_rows_dump(rl_seg *s, uint32_t start, uint32_t n, uint64_t *words, uint64_t *leases);
/* The schedule of rows [start, start+n) as plain columns, for a checkpoint: due_ms and lane are
 * -1 for a row that is not queued (removed); provenance and urgent are 0/1. */
int rl_rows_export(rl_seg *s, uint32_t start, uint32_t n, int64_t *due_ms, int64_t *interval_s,
                   int64_t *failures, int64_t *provenance, int64_t *urgent, int64_t *lane);

#endif /* CDEF-SKIP */
