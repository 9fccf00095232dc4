/* Writes: add, complete, fail, release, renew, prioritize, remove, restamp.
 *
 * Every write that moves a row goes through rl_publish(), which keeps the order the floor
 * protocol needs (csrc/floor.c): 1. the row's key is stored, 2. (key, row) is appended to the
 * ring and ring_min lowered, 3. the lane's floor is lowered with its epoch bumped. Writes that
 * need a lease (complete, fail, release) first CAS the token into a "writing" word that no claimer can
 * take and no other holder of the same token can match, and end the lease only after step 3:
 * a stale token therefore fails its first CAS and changes nothing.
 *
 * A writer killed midway: a leased write's rows carry its "writing" word, so they are known as
 * a dead owner's; an unleased one (add, prioritize, restamp) names the rows it may leave half
 * done in its owner's write journal (csrc/layout.h) from before its first store (for an add,
 * before it reserves them) until after it published them. A repair then rolls the write forward
 * (its full rebuild indexes every stored key and lowers the floors to them) or back (a reserved
 * row never written is taken back: rl_reserved_settle), and verify() reports what is left until
 * then as a dead writer's mark, never as a broken invariant (docs/design.md §5; the spin model
 * tests/model/add.pml).
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "layout.h"


static int64_t clamp_due(int64_t v) {
    if (v < 0) return 0;
    return v > (int64_t)RL_HORIZON ? (int64_t)RL_HORIZON : v;
}

/* Keys stored but not in the ring (it could not take them: out of memory for a merge): the
 * next merge would not re-read those rows, so ask for a repair, whose full rebuild reads all. */
static int unpublished(rl_seg *s, int rc) {
    atomic_store(&s->h->repair_needed, 1);
    return rc;
}

/* Make stored keys visible to claim passes at once and lower their lanes' floors. Batches
 * larger than the ring are published by a full rebuild of the index instead. `derived`: the
 * keys were derived under the policy in force (an add, a complete, a move), so they widen the
 * lanes' weight bounds too; a put-back of keys decided earlier (rl_flight_return) does not. */
int rl_publish(rl_seg *s, uint32_t owner, uint32_t n, const uint64_t *keys, const uint32_t *rows,
               int derived, uint32_t *advice) {
    uint32_t lane_min[RL_MAX_LANES];
    int rc;
    if (n == 0) return RL_OK;
    for (uint32_t i = 0; i < n; i++) /* iv_min, iv_max first: no row is visible outside them */
        if (keys[i] != RL_KEY_NONE)
            rl_lane_iv_note(s, rl_key_lane(keys[i]),
                            atomic_load_explicit(&s->intervals[rows[i]], memory_order_relaxed),
                            derived);
    if (n <= s->h->ring_capacity) {
        rc = rl_ring_append(s, owner, n, keys, rows, advice);
    } else {
        while ((rc = rl_compact(s, owner, 1)) == RL_E_BUSY) sched_yield();
    }
    if (rc != RL_OK) return unpublished(s, rc);
    for (uint32_t l = 0; l < RL_MAX_LANES; l++) lane_min[l] = UINT32_MAX;
    uint32_t high = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (keys[i] == RL_KEY_NONE) continue;
        uint32_t l = rl_key_lane(keys[i]), m = rl_minute(rl_key_due(keys[i]));
        if (m < lane_min[l]) lane_min[l] = m;
        if (l > high) high = l;
    }
    uint32_t cur = atomic_load(&s->h->lanes_high);
    while (cur < high && !atomic_compare_exchange_weak(&s->h->lanes_high, &cur, high))
        ;
    for (uint32_t l = 0; l < RL_MAX_LANES; l++)
        if (lane_min[l] != UINT32_MAX) rl_floor_lower(s, l, lane_min[l]);
    return RL_OK;
}

/* ================================================================ the write journal ===== */

/* Take a free journal slot of `owner` for `entry` (one per thread of the owner inside an
 * unleased write; more threads than slots wait their turn). */
static int journal_take(rl_seg *s, uint32_t owner, uint64_t entry) {
    _Atomic uint64_t *w = s->owners[owner].writes;
    for (;;) {
        for (int j = 0; j < RL_OWNER_WRITES; j++) {
            uint64_t free_slot = 0;
            if (atomic_load_explicit(&w[j], memory_order_relaxed) == 0 &&
                atomic_compare_exchange_strong(&w[j], &free_slot, entry))
                return j;
        }
        sched_yield();
    }
}

static void journal_set(rl_seg *s, uint32_t owner, int j, uint64_t entry) {
    atomic_store(&s->owners[owner].writes[j], entry);
}

/* After the write's rows are published (or it changed nothing). */
static void journal_drop(rl_seg *s, uint32_t owner, int j) {
    atomic_store(&s->owners[owner].writes[j], 0);
}

/* The journal entries of every owner not marked dead (alive, or registering) into `entries`;
 * how many. */
static int journal_snapshot(rl_seg *s, uint64_t *entries) {
    int n = 0;
    uint32_t high = atomic_load(&s->h->owners_high);
    if (high >= RL_MAX_OWNERS) high = RL_MAX_OWNERS - 1;
    for (uint32_t o = 1; o <= high; o++) {
        if (!rl_owner_live(s, o)) continue;
        for (int j = 0; j < RL_OWNER_WRITES; j++) {
            uint64_t w = atomic_load(&s->owners[o].writes[j]);
            if (w) entries[n++] = w;
        }
    }
    return n;
}

static int journal_covered(const uint64_t *entries, int n, uint32_t row) {
    for (int i = 0; i < n; i++)
        if (rl_journal_covers(entries[i], row)) return 1;
    return 0;
}

/* In a repair (the merge word held, so one at a time), after writers died: every row below
 * `used` (rows_used, read before this) whose word is still exactly RL_KEY_NONE was reserved by
 * an add and not written. Its writer's journal covered it from before the reservation until
 * after its stores, so where no live owner's journal covers it now, its writer is dead and no
 * one will ever write it: it is taken back (VOID, not counted in the rows). Rows a live journal
 * covers (a write under way, or a stale entry of a live writer whose CAS is about to fail) wait
 * for the next repair (the next owner found dead, reap(), verify() finding them): asking for
 * one at once would rebuild the index on every pass while a writer sits stopped mid-add. */
void rl_reserved_settle(rl_seg *s, uint32_t used, rl_repair_out *out) {
    static const uint32_t most = (RL_MAX_OWNERS - 1) * RL_OWNER_WRITES;
    uint64_t *entries = malloc(most * sizeof(uint64_t));
    int n = entries ? journal_snapshot(s, entries) : 0;
    for (uint32_t r = 0; r < used; r++) {
        uint64_t word = atomic_load(&s->rows[r].word); /* after the journals: see above */
        if (word != RL_KEY_NONE) continue;
        if (!entries || journal_covered(entries, n, r)) {
            out->waiting++;
            continue;
        }
        if (atomic_compare_exchange_strong(&s->rows[r].word, &word, RL_KEY_NONE | RL_WORD_VOID)) {
            atomic_fetch_add(&s->h->rows_void, 1);
            out->voided++;
        }
    }
    free(entries);
}

static int row_ok(rl_seg *s, uint32_t row) {
    return row < atomic_load(&s->h->rows_used) && row < s->h->row_capacity;
}

/* A row id as a caller passed it (int64): range-checked before it is ever narrowed. */
static int row_ok64(rl_seg *s, int64_t row) {
    return row >= 0 && row < (int64_t)atomic_load(&s->h->rows_used) && row < (int64_t)s->h->row_capacity;
}

/* ================================================================ add ===== */

int rl_add_many(rl_seg *s, uint32_t owner, uint32_t n, const int64_t *due, const int64_t *interval,
                const int64_t *prov, const int64_t *failures, int64_t *out_rows, uint32_t *advice) {
    const rl_policy *p;
    if (owner == 0 || owner >= RL_MAX_OWNERS) return RL_E_VALUE;
    for (uint32_t i = 0; i < n; i++) { /* every element checked before anything changes */
        if (due[i] < 0 || due[i] >= (int64_t)RL_STRIDE) return RL_E_RANGE;
        if (interval[i] < 1 || interval[i] > (int64_t)UINT32_MAX) return RL_E_RANGE;
        if (prov[i] != RL_PROV_SUBMITTED && prov[i] != RL_PROV_DISCOVERED) return RL_E_VALUE;
        if (failures && (failures[i] < 0 || failures[i] > 255)) return RL_E_RANGE;
    }
    if (n == 0) return RL_OK;
    /* Everything that can wait or fail comes before the rows are reserved: a process killed
     * between the reservation and the row words below leaves reserved rows never queued, so
     * that window holds nothing but the stores. */
    p = rl_policy_cached(s);
    uint64_t *keys = malloc((size_t)n * 8);
    uint32_t *rows = malloc((size_t)n * 4);
    if (!keys || !rows) {
        free(keys);
        free(rows);
        return RL_E_SYS;
    }
    /* The journal names the rows before the CAS that reserves them (each attempt's), and
     * until they are published: a repair never takes back a row this add may still write. */
    uint32_t first = atomic_load(&s->h->rows_used);
    int j = journal_take(s, owner, RL_JOURNAL(first, n));
    do {
        if ((uint64_t)first + n > s->h->row_capacity) {
            journal_drop(s, owner, j);
            free(keys);
            free(rows);
            return RL_E_CAPACITY;
        }
        journal_set(s, owner, j, RL_JOURNAL(first, n));
    } while (!atomic_compare_exchange_weak(&s->h->rows_used, &first, first + n));
    for (uint32_t i = 0; i < n; i++) {
        uint32_t r = first + i, f = failures ? (uint32_t)failures[i] : 0;
        uint32_t lane = rl_lane_for(p, (uint32_t)prov[i], (uint32_t)interval[i], f, 0);
        atomic_store(&s->intervals[r], (uint32_t)interval[i]);
        keys[i] = rl_encode(lane, (uint64_t)due[i]);
        rows[i] = r;
        atomic_store(&s->rows[r].word, rl_word_make(s, keys[i], f, (uint32_t)prov[i], 0, (uint32_t)interval[i]));
        out_rows[i] = r;
    }
    int rc = rl_publish(s, owner, n, keys, rows, 1, advice);
    journal_drop(s, owner, j);
    free(keys);
    free(rows);
    return rc;
}

/* ================================================================ leased writes ===== */

/* Token -> "writing" word: same tok, this owner, never expires, so claimers pass it by. */
static int lease_begin_write(rl_seg *s, uint32_t owner, uint32_t row, uint64_t token, uint64_t *writing) {
    token ^= rl_token_mask(row);
    uint64_t expect = token;
    if (RL_LEASE_OWNER(token) == 0) return RL_E_LEASE;
    *writing = RL_LEASE_MAKE(RL_HORIZON, owner, RL_LEASE_TOK(token));
    if (*writing == token) *writing = RL_LEASE_MAKE(RL_HORIZON - 1, owner, RL_LEASE_TOK(token));
    if (!atomic_compare_exchange_strong(&s->rows[row].lease, &expect, *writing)) return RL_E_LEASE;
    if (rl_row_key(s, row) == RL_KEY_NONE) { /* removed while leased */
        atomic_compare_exchange_strong(&s->rows[row].lease, writing, RL_LEASE_FREE(*writing));
        return RL_E_LEASE;
    }
    return RL_OK;
}

static void lease_end_write(rl_seg *s, uint32_t row, uint64_t writing) {
    uint64_t expect = writing;
    if (atomic_compare_exchange_strong(&s->rows[row].lease, &expect, RL_LEASE_FREE(writing)))
        rl_lease_freed(s, row);
}

/* A batch up to this size keeps its scratch arrays on the stack (a worker's usual batch). */
#define SMALL_BATCH 256

/* Scratch for a batch of leased writes (complete_many, release_many). */
typedef struct {
    uint64_t *writing; /* per row of the call: its writing word, where its token took */
    uint64_t *words;   /* per row written: its new key (complete) or its row word (release) */
    uint32_t *rows;    /* per row written: the row */
    int heap;          /* the three are malloc'd (more than SMALL_BATCH rows) */
    uint64_t small_writing[SMALL_BATCH], small_words[SMALL_BATCH];
    uint32_t small_rows[SMALL_BATCH];
} Scratch;

static int Scratch_Init(Scratch *b, uint32_t n) {
    b->heap = n > SMALL_BATCH;
    b->writing = b->heap ? malloc((size_t)n * 8) : b->small_writing;
    b->words = b->heap ? malloc((size_t)n * 8) : b->small_words;
    b->rows = b->heap ? malloc((size_t)n * 4) : b->small_rows;
    return b->writing && b->words && b->rows ? RL_OK : RL_E_SYS;
}

static void Scratch_Free(Scratch *b) {
    if (!b->heap) return;
    free(b->writing);
    free(b->words);
    free(b->rows);
}

/* End the leases whose tokens took (ok[i]), after their rows were published; how many. */
static uint32_t leases_end_batch(rl_seg *s, uint32_t n, const int64_t *rows, const uint8_t *ok,
                                 const uint64_t *writing) {
    uint32_t done = 0;
    for (uint32_t i = 0; i < n; i++)
        if (ok[i]) {
            lease_end_write(s, (uint32_t)rows[i], writing[i]);
            done++;
        }
    return done;
}

int rl_complete_many(rl_seg *s, uint32_t owner, uint32_t n, const int64_t *rows,
                     const int64_t *tokens, const int64_t *next_due, int64_t now_ms, uint8_t *ok,
                     uint32_t *advice) {
    const rl_policy *p;
    Scratch b;
    if (owner == 0 || owner >= RL_MAX_OWNERS || now_ms < 0 || now_ms >= (int64_t)RL_STRIDE)
        return RL_E_VALUE;
    for (uint32_t i = 0; i < n; i++) {
        if (!row_ok64(s, rows[i])) return RL_E_RANGE;
        if (next_due && (next_due[i] < -1 || next_due[i] >= (int64_t)RL_STRIDE)) return RL_E_RANGE;
        /* The lease CAS below is a full barrier that the next row's reads cannot pass: start
         * every row's (and interval's) cache miss now, so they overlap instead of queueing. */
        rl_prefetch_w(&s->rows[rows[i]]); /* its lease is CASed first */
        __builtin_prefetch((const void *)&s->intervals[rows[i]]);
    }
    if (n == 0) return RL_OK;
    p = rl_policy_cached(s);
    int rc = Scratch_Init(&b, n);
    uint32_t m = 0, done = 0;
    if (rc == RL_OK) {
        for (uint32_t i = 0; i < n; i++) {
            uint32_t r = (uint32_t)rows[i];
            ok[i] = lease_begin_write(s, owner, r, (uint64_t)tokens[i], &b.writing[i]) == RL_OK;
            if (!ok[i]) continue;
            uint64_t word = atomic_load(&s->rows[r].word);
            uint32_t interval = atomic_load(&s->intervals[r]), prov = RL_WORD_PROV(word);
            int64_t due = next_due && next_due[i] >= 0 ? next_due[i]
                                                        : clamp_due(now_ms + (int64_t)interval * 1000);
            b.words[m] = rl_encode(rl_lane_for(p, prov, interval, 0, 0), (uint64_t)due);
            b.rows[m] = r;
            atomic_store(&s->rows[r].word, rl_word_make(s, b.words[m], 0, prov, 0, interval));
            m++;
        }
        rc = rl_publish(s, owner, m, b.words, b.rows, 1, advice);
        done = leases_end_batch(s, n, rows, ok, b.writing);
    }
    Scratch_Free(&b);
    return rc == RL_OK ? (int)done : rc;
}

int64_t rl_complete_req(const rl_req *r, uint32_t n, const int64_t *rows, const int64_t *tokens,
                        int64_t now_ms, uint8_t *ok) {
    uint32_t advice = 0;
    int done = rl_complete_many(r->s, r->owner, n, rows, tokens, NULL, now_ms, ok, &advice);
    return done < 0 ? done : (int64_t)done | (int64_t)advice << 32;
}

int rl_fail(rl_seg *s, uint32_t owner, uint32_t row, uint64_t token, int64_t retry_at,
            int64_t now_ms, int permanent, uint32_t *advice) {
    const rl_policy *p;
    uint64_t writing;
    if (owner == 0 || owner >= RL_MAX_OWNERS || now_ms < 0 || now_ms >= (int64_t)RL_STRIDE)
        return RL_E_VALUE;
    if (!row_ok(s, row)) return RL_E_RANGE;
    if (retry_at < -1 || retry_at >= (int64_t)RL_STRIDE) return RL_E_RANGE;
    int rc = lease_begin_write(s, owner, row, token, &writing);
    if (rc != RL_OK) return rc;
    p = rl_policy_cached(s);
    uint64_t word = atomic_load(&s->rows[row].word);
    uint32_t interval = atomic_load(&s->intervals[row]), prov = RL_WORD_PROV(word);
    uint32_t f = RL_WORD_FAILURES(word) + 1;
    if (permanent && f < p->cold_after) f = p->cold_after; /* a 404 will not heal: cold at once */
    if (f > 255) f = 255;
    /* Back-off: 30 s doubling per failure, never longer than the row's own interval. In the cold
     * lane, its interval doubling per further failure up to RL_COLD_BACKOFF_DOUBLINGS times: the
     * cold floor would retry a row that keeps failing each time a short back-off ends, more
     * often than the healthy rows of its interval. Lanes disabled, there is no cold lane. */
    int64_t iv = (int64_t)interval * 1000, backoff;
    if (f >= p->cold_after && p->lanes_enabled) {
        uint32_t d = f - p->cold_after;
        backoff = iv << (d < RL_COLD_BACKOFF_DOUBLINGS ? d : RL_COLD_BACKOFF_DOUBLINGS);
    } else {
        backoff = 30000LL << (f - 1 < 20 ? f - 1 : 20);
        if (backoff > iv) backoff = iv;
    }
    int64_t due = retry_at >= 0 ? retry_at : clamp_due(now_ms + backoff);
    uint64_t key = rl_encode(rl_lane_for(p, prov, interval, f, 0), (uint64_t)due);
    atomic_store(&s->rows[row].word, rl_word_make(s, key, f, prov, 0, interval));
    rc = rl_publish(s, owner, 1, &key, &row, 1, advice);
    lease_end_write(s, row, writing);
    return rc;
}

/* Rows go back due as they were: keys unchanged, but taken out of the index at grant (FLIGHT),
 * so they are put back through the ring (one append for the batch) before their leases end
 * (csrc/sweep.c). ok[i]: whether rows[i]'s token was a live lease (a stale one changes nothing). */
int rl_release_many(rl_seg *s, uint32_t owner, uint32_t n, const int64_t *rows,
                    const int64_t *tokens, uint8_t *ok, uint32_t *advice) {
    Scratch b;
    if (owner == 0 || owner >= RL_MAX_OWNERS) return RL_E_VALUE;
    for (uint32_t i = 0; i < n; i++) {
        if (!row_ok64(s, rows[i])) return RL_E_RANGE;
        rl_prefetch_w(&s->rows[rows[i]]);
    }
    if (n == 0) return RL_OK;
    int rc = Scratch_Init(&b, n);
    uint32_t m = 0, done = 0;
    if (rc == RL_OK) {
        for (uint32_t i = 0; i < n; i++) {
            uint32_t r = (uint32_t)rows[i];
            ok[i] = lease_begin_write(s, owner, r, (uint64_t)tokens[i], &b.writing[i]) == RL_OK;
            if (!ok[i]) continue;
            uint64_t word = atomic_load(&s->rows[r].word);
            if (!(word & RL_WORD_FLIGHT)) continue; /* never taken out (or rewritten since) */
            b.rows[m] = r;
            b.words[m++] = word;
        }
        rc = m ? rl_flight_return(s, owner, m, b.rows, b.words, advice) : RL_OK;
        done = leases_end_batch(s, n, rows, ok, b.writing);
    }
    Scratch_Free(&b);
    return rc == RL_OK ? (int)done : rc;
}

int rl_renew(rl_seg *s, uint32_t owner, uint32_t row, uint64_t token, int64_t now_ms,
             int64_t lease_ms, uint64_t *new_token) {
    if (owner == 0 || owner >= RL_MAX_OWNERS) return RL_E_VALUE; /* it may append to the ring */
    if (!row_ok(s, row)) return RL_E_RANGE;
    if (lease_ms <= 0 || now_ms < 0 || now_ms >= (int64_t)RL_STRIDE) return RL_E_VALUE;
    token ^= rl_token_mask(row);
    if (RL_LEASE_OWNER(token) == 0) return RL_E_LEASE;
    int64_t exp = now_ms + lease_ms;
    if (exp > (int64_t)RL_HORIZON - 2) exp = (int64_t)RL_HORIZON - 2; /* below the writing word */
    uint64_t nw = RL_LEASE_MAKE(exp, RL_LEASE_OWNER(token), RL_LEASE_TOK(token));
    if (nw == token) { /* same expiry: nothing to change, but the lease must still be ours */
        if (atomic_load(&s->rows[row].lease) != token) return RL_E_LEASE;
    } else {
        uint64_t expect = token;
        if (!atomic_compare_exchange_strong(&s->rows[row].lease, &expect, nw)) return RL_E_LEASE;
    }
    /* Held again, so out of the index (it may have been put back after it lapsed): passes and
     * merges drop its entries, and the end of this lease puts it back. FLIGHT first, then
     * lease_min, as a grant does (csrc/sweep.c). A row that was back in the index gets a
     * (NONE, row) slot, as a removal does, so the next merge re-reads it and drops its entry. */
    uint64_t was = atomic_fetch_or(&s->rows[row].word, RL_WORD_FLIGHT);
    rl_lease_min_note(s, exp);
    if (!(was & RL_WORD_FLIGHT)) {
        uint64_t none = RL_KEY_NONE;
        if (rl_ring_append(s, owner, 1, &none, &row, NULL) != RL_OK) unpublished(s, RL_OK);
    }
    *new_token = nw ^ rl_token_mask(row);
    return RL_OK;
}

/* ================================================================ unleased writes ===== */

int rl_prioritize(rl_seg *s, uint32_t owner, uint32_t row, int rush, int64_t now_ms, uint32_t *advice) {
    const rl_policy *p;
    if (owner == 0 || owner >= RL_MAX_OWNERS || now_ms < 0 || now_ms >= (int64_t)RL_STRIDE)
        return RL_E_VALUE;
    if (!row_ok(s, row)) return RL_E_RANGE;
    uint64_t word = atomic_load(&s->rows[row].word);
    if (RL_WORD_KEY(word) == RL_KEY_NONE) return RL_E_VALUE;
    p = rl_policy_cached(s);
    uint32_t interval = atomic_load(&s->intervals[row]), prov = RL_WORD_PROV(word), f = RL_WORD_FAILURES(word);
    uint64_t key = rl_encode(rl_lane_for(p, prov, interval, f, rush), (uint64_t)now_ms);
    int j = journal_take(s, owner, RL_JOURNAL(row, 1));
    atomic_store(&s->rows[row].word, rl_word_make(s, key, f, prov, rush ? 1u : 0u, interval));
    int rc = rl_publish(s, owner, 1, &key, &row, 1, advice);
    journal_drop(s, owner, j);
    return rc;
}

/* A row's provenance changed (its page left every sitemap, or came back): the lane is derived
 * again, the due time, failures and urgency kept. As prioritize does, a leased row is rewritten
 * too: its new key is published (FLIGHT clear), its lease goes on, and whatever ends the lease
 * derives the lane from the new provenance. A CAS, so a write landing meanwhile is not undone. */
int rl_reclassify(rl_seg *s, uint32_t owner, uint32_t row, uint32_t provenance, uint32_t *advice) {
    if (owner == 0 || owner >= RL_MAX_OWNERS) return RL_E_VALUE;
    if (provenance != RL_PROV_SUBMITTED && provenance != RL_PROV_DISCOVERED) return RL_E_VALUE;
    if (!row_ok(s, row)) return RL_E_RANGE;
    const rl_policy *p = rl_policy_cached(s);
    uint32_t interval = atomic_load(&s->intervals[row]);
    uint64_t word = atomic_load(&s->rows[row].word), key, nw;
    int j = journal_take(s, owner, RL_JOURNAL(row, 1)); /* stored, maybe not yet published */
    do {
        if (RL_WORD_KEY(word) == RL_KEY_NONE || RL_WORD_PROV(word) == provenance) {
            journal_drop(s, owner, j);
            return RL_WORD_KEY(word) == RL_KEY_NONE ? RL_E_VALUE : RL_OK;
        }
        uint32_t f = RL_WORD_FAILURES(word), urgent = RL_WORD_URGENT(word);
        key = rl_encode(rl_lane_for(p, provenance, interval, f, (int)urgent),
                        rl_key_due(RL_WORD_KEY(word)));
        nw = rl_word_make(s, key, f, provenance, urgent, interval);
    } while (!atomic_compare_exchange_weak(&s->rows[row].word, &word, nw));
    int rc = rl_publish(s, owner, 1, &key, &row, 1, advice);
    journal_drop(s, owner, j);
    return rc;
}

int rl_remove(rl_seg *s, uint32_t owner, uint32_t row, uint32_t *advice) {
    if (owner == 0 || owner >= RL_MAX_OWNERS) return RL_E_VALUE; /* it may have to merge */
    if (!row_ok(s, row)) return RL_E_RANGE;
    uint64_t word = atomic_load(&s->rows[row].word);
    if (RL_WORD_KEY(word) == RL_KEY_NONE) return RL_E_VALUE;
    atomic_store(&s->rows[row].word, RL_WORD_GONE |
                 RL_WORD_MAKE(RL_KEY_NONE, RL_WORD_FAILURES(word), RL_WORD_PROV(word), 0));
    /* End any lease with a new tok, so its holder's token is stale (LeaseLost, not a revival). */
    uint64_t w = atomic_load(&s->rows[row].lease);
    while (!atomic_compare_exchange_weak(&s->rows[row].lease, &w,
                                         RL_LEASE_MAKE(0, 0, RL_LEASE_TOK(w) + 1u)))
        ;
    /* (NONE, row) in the ring: nothing to claim or index, but it tells the next merge that this
     * row's index entry went stale (the merge re-reads only rows the ring names). No floor
     * moves: a removal lowers nothing. */
    uint64_t none = RL_KEY_NONE;
    int rc = rl_ring_append(s, owner, 1, &none, &row, advice);
    return rc == RL_OK ? RL_OK : unpublished(s, rc);
}

/* Re-encode rows written with lanes disabled into their derived lanes, due times untouched.
 * Bounded by `limit`, cursor-free (a restamped row is no longer a lane-0 non-urgent row that
 * derives elsewhere), and refused once lanes are on: a lane-0 row could then be urgent intent. */
int rl_restamp(rl_seg *s, uint32_t owner, uint32_t limit, uint32_t *restamped, uint32_t *remaining) {
    rl_policy p;
    if (owner == 0 || owner >= RL_MAX_OWNERS) return RL_E_VALUE;
    rl_policy_read(s, &p);
    if (p.lanes_enabled) return RL_E_NOTALLOWED;
    rl_policy on = p;
    on.lanes_enabled = 1;
    uint32_t used = atomic_load(&s->h->rows_used), m = 0, left = 0;
    uint64_t *keys = malloc((size_t)(limit ? limit : 1) * 8);
    uint32_t *rows = malloc((size_t)(limit ? limit : 1) * 4);
    if (!keys || !rows) {
        free(keys);
        free(rows);
        return RL_E_SYS;
    }
    int j = journal_take(s, owner, RL_JOURNAL(0, used ? used : 1)); /* any row it may move */
    for (uint32_t r = 0; r < used && r < s->h->row_capacity; r++) {
        uint64_t word = atomic_load(&s->rows[r].word), key = RL_WORD_KEY(word);
        if (key == RL_KEY_NONE || rl_key_lane(key) != 0 || RL_WORD_URGENT(word)) continue;
        uint32_t iv = atomic_load(&s->intervals[r]);
        uint32_t lane = rl_lane_for(&on, RL_WORD_PROV(word), iv, RL_WORD_FAILURES(word), 0);
        if (lane == 0) continue;
        if (m == limit) {
            left = 1;
            break;
        }
        uint64_t nk = rl_encode(lane, rl_key_due(key));
        uint64_t nw = (word & ~(RL_KEY_MASK | RL_WORD_CLS_MASK)) | nk |
                      (uint64_t)rl_iv_class(s, lane, iv) << RL_WORD_CLS_SHIFT; /* the new lane's */
        if (!atomic_compare_exchange_strong(&s->rows[r].word, &word, nw)) continue; /* moved: its writer decided */
        keys[m] = nk;
        rows[m] = r;
        m++;
    }
    uint32_t advice = 0;
    int rc = rl_publish(s, owner, m, keys, rows, 1, &advice);
    journal_drop(s, owner, j);
    free(keys);
    free(rows);
    *restamped = m;
    *remaining = left;
    return rc;
}

/* ================================================================ putting rows back ===== */

#define RETURN_BATCH 256

/* Put FLIGHT rows back: clear the flag (only where the row word is still `words[i]`: a row
 * rewritten meanwhile was published by its writer), then publish their keys. Clearing first
 * keeps a merge from dropping the new ring entry as a FLIGHT row's; a process killed between
 * the two leaves a row findable only by the full rebuild its death asks for (rl_repair). */
int rl_flight_return(rl_seg *s, uint32_t owner, uint32_t n, const uint32_t *rows,
                     const uint64_t *words, uint32_t *advice) {
    uint64_t keys[RETURN_BATCH];
    uint32_t back[RETURN_BATCH];
    for (uint32_t done = 0; done < n;) {
        uint32_t m = 0, stop = n - done > RETURN_BATCH ? done + RETURN_BATCH : n;
        for (; done < stop; done++) {
            uint64_t expect = words[done];
            if (!atomic_compare_exchange_strong(&s->rows[rows[done]].word, &expect,
                                                expect & ~RL_WORD_FLIGHT))
                continue;
            if (RL_WORD_KEY(expect) == RL_KEY_NONE) continue; /* removed: nothing to put back */
            keys[m] = RL_WORD_KEY(expect);
            back[m++] = rows[done];
        }
        int rc = rl_publish(s, owner, m, keys, back, 0, advice);
        if (rc != RL_OK) return rc;
    }
    return RL_OK;
}
