/* Looking at a segment without a debugger: one row, per-lane statistics, and verify(), which
 * walks everything and reports each broken invariant it finds. Not on any hot path. */
#include <stdlib.h>
#include <string.h>

#include "layout.h"

int rl_row_info_get(rl_seg *s, uint32_t row, int64_t now_ms, rl_row_info *o) {
    if (row >= atomic_load(&s->h->rows_used) || row >= s->h->row_capacity) return RL_E_RANGE;
    uint64_t word = atomic_load(&s->rows[row].word), key = RL_WORD_KEY(word);
    uint64_t w = atomic_load(&s->rows[row].lease);
    memset(o, 0, sizeof *o);
    o->row = row;
    o->key = key;
    o->queued = key != RL_KEY_NONE;
    o->lane = o->queued ? rl_key_lane(key) : 0;
    o->due_ms = o->queued ? (int64_t)rl_key_due(key) : -1;
    o->lease = w;
    o->lease_owner = RL_LEASE_OWNER(w);
    o->lease_expiry_ms = o->lease_owner && RL_LEASE_EXPIRY(w) > now_ms ? RL_LEASE_EXPIRY(w) : -1;
    o->interval_s = atomic_load(&s->intervals[row]);
    o->failures = RL_WORD_FAILURES(word);
    o->provenance = RL_WORD_PROV(word);
    o->urgent = RL_WORD_URGENT(word);
    return RL_OK;
}

int rl_stats(rl_seg *s, int64_t now_ms, rl_lane_stats *out) {
    for (uint32_t l = 0; l < RL_MAX_LANES; l++) {
        rl_lane *ln = &s->lanes[l];
        memset(&out[l], 0, sizeof out[l]);
        out[l].floor_word = atomic_load(&ln->floor);
        out[l].ring_min = RL_RMIN_KEY(atomic_load(&ln->ring_min));
        out[l].granted = atomic_load(&ln->granted);
        out[l].spilled = atomic_load(&ln->spilled);
        out[l].stale_skipped = atomic_load(&ln->stale_skipped);
        out[l].lease_refused = atomic_load(&ln->lease_refused);
        out[l].iv_min = atomic_load(&ln->wv_min);
        out[l].iv_max = atomic_load(&ln->wv_max);
    }
    uint32_t used = atomic_load(&s->h->rows_used);
    for (uint32_t r = 0; r < used && r < s->h->row_capacity; r++) {
        uint64_t word = atomic_load_explicit(&s->rows[r].word, memory_order_relaxed);
        uint64_t key = RL_WORD_KEY(word);
        if (key == RL_KEY_NONE) continue;
        uint32_t l = rl_key_lane(key);
        if (l >= RL_MAX_LANES) continue;
        out[l].queued++;
        if ((int64_t)rl_key_due(key) <= now_ms) out[l].due++;
        uint64_t w = atomic_load_explicit(&s->rows[r].lease, memory_order_relaxed);
        if (RL_LEASE_OWNER(w) && RL_LEASE_EXPIRY(w) > now_ms) out[l].leased++;
        if (RL_LEASE_OWNER(w) && (word & RL_WORD_FLIGHT)) out[l].in_flight++;
    }
    return RL_OK;
}

static void note(rl_problem *out, uint32_t max, uint32_t *found, int32_t code, uint32_t row,
                 uint32_t lane, uint64_t detail) {
    if (*found < max) out[*found] = (rl_problem){code, row, lane, detail};
    (*found)++;
}

/* ---- crash marks: what a writer killed midway left (csrc/writes.c, the write journal) ---- */

typedef struct {
    uint64_t entry;
    uint32_t owner;
    uint32_t live;
} Journal;

typedef struct {
    Journal *j;
    int n;
    uint8_t memo[RL_MAX_OWNERS]; /* rl_owner_alive's: 0 unknown, 1 alive, 2 dead */
} Writers;

/* Every journal entry of every owner slot in use, with whether its owner lives (a process found
 * gone is marked dead on the way, as a claim pass's owner check would). */
static int writers_read(rl_seg *s, Writers *w) {
    memset(w->memo, 0, sizeof w->memo);
    w->n = 0;
    w->j = malloc((RL_MAX_OWNERS - 1) * RL_OWNER_WRITES * sizeof(Journal));
    if (!w->j) return RL_E_SYS;
    uint32_t high = atomic_load(&s->h->owners_high);
    if (high >= RL_MAX_OWNERS) high = RL_MAX_OWNERS - 1;
    for (uint32_t o = 1; o <= high; o++) {
        uint32_t st = RL_OWNER_STATE(atomic_load(&s->owners[o].state));
        if (st == RL_OWNER_FREE) continue;
        uint32_t live = st == RL_OWNER_CLAIMING || (st == RL_OWNER_ALIVE && rl_owner_alive(s, o, w->memo));
        for (int k = 0; k < RL_OWNER_WRITES; k++) {
            uint64_t e = atomic_load(&s->owners[o].writes[k]);
            if (e) w->j[w->n++] = (Journal){e, o, live};
        }
    }
    return RL_OK;
}

/* Who may have left `row` half done: 1 and *who a dead owner (its journal covers the row, or
 * its lease word is on it), 2 a live writer still at work on it, 0 no writer. */
static int row_writer(rl_seg *s, Writers *w, uint32_t row, uint64_t lease, uint32_t *who) {
    int found = 0;
    for (int i = 0; i < w->n; i++) {
        if (!rl_journal_covers(w->j[i].entry, row)) continue;
        if (w->j[i].live) return 2;
        found = 1;
        *who = w->j[i].owner;
    }
    uint32_t o = RL_LEASE_OWNER(lease);
    if (!found && o && RL_OWNER_STATE(atomic_load(&s->owners[o].state)) != RL_OWNER_FREE &&
        !rl_owner_alive(s, o, w->memo)) {
        found = 1;
        *who = o;
    }
    return found;
}

/* rl_verify's walk of the row table: owners, keys, rows in flight, floors, findability (`seen`:
 * the rows the index and the ring name at their key), and dead writers' marks. */
static void rows_check(rl_seg *s, uint32_t used, const uint8_t *seen, Writers *writers,
                       rl_problem *out, uint32_t max, uint32_t *found) {
    uint64_t lmin = atomic_load(&s->h->lease_min);
    for (uint32_t r = 0; r < used; r++) {
        uint64_t word = atomic_load(&s->rows[r].word), key = RL_WORD_KEY(word);
        uint64_t w = atomic_load(&s->rows[r].lease);
        uint32_t o = RL_LEASE_OWNER(w);
        if (o) {
            uint32_t st = RL_OWNER_STATE(atomic_load(&s->owners[o].state));
            if (st == RL_OWNER_FREE) note(out, max, found, RL_V_UNKNOWN_OWNER, r, 0, o);
        }
        uint32_t who = 0;
        if (word == RL_KEY_NONE) { /* reserved, never written */
            if (row_writer(s, writers, r, 0, &who) != 2)
                note(out, max, found, RL_V_ABANDONED, r, 0, who);
            continue;
        }
        uint32_t cls = RL_WORD_CLS(word);
        if (key == RL_KEY_NONE) {
            if (cls) note(out, max, found, RL_V_IV_CLASS, r, 0, cls);
            continue;
        }
        uint32_t l = rl_key_lane(key);
        if (l >= RL_MAX_LANES) {
            note(out, max, found, RL_V_BAD_KEY, r, l, key);
            continue;
        }
        uint32_t iv = atomic_load(&s->intervals[r]);
        if (cls && atomic_load(&s->lanes[l].iv_cls[cls - 1]) != iv)
            note(out, max, found, RL_V_IV_CLASS, r, l, iv); /* a pass would weigh it wrong */
        if ((word & RL_WORD_FLIGHT) && o) { /* in flight: its lease's end must put it back */
            if (!(lmin & RL_LMIN_SWEEPING) && RL_LEASE_EXPIRY(w) < RL_LMIN_MS(lmin))
                note(out, max, found, RL_V_LEASE_UNCOVERED, r, l, (uint64_t)RL_LEASE_EXPIRY(w));
            continue;
        }
        uint32_t fl = RL_FLOOR_MINUTE(atomic_load(&s->lanes[l].floor));
        int below = fl && rl_minute(rl_key_due(key)) < fl;
        if (!below && seen[r]) continue;
        int writer = row_writer(s, writers, r, w, &who);
        if (writer == 1) note(out, max, found, RL_V_DEAD_WRITE, r, l, who);
        if (writer) continue;
        if (below) note(out, max, found, RL_V_BELOW_FLOOR, r, l, key);
        if (!seen[r]) note(out, max, found, RL_V_NOT_FINDABLE, r, l, key);
    }
}

/* Meant for a quiescent segment (tests call it after every scenario). What a writer killed
 * midway left is reported as a crash mark (RL_V_DEAD_WRITE, RL_V_ABANDONED: the next repair
 * finishes or takes it back), never as a broken invariant; a live writer's write under way is
 * not reported. */
int rl_verify(rl_seg *s, rl_problem *out, uint32_t max, uint32_t *found) {
    rl_header *h = s->h;
    *found = 0;
    if (rl_layout_check(s->base, s->bytes) != RL_OK) {
        note(out, max, found, RL_V_HEADER, 0, 0, 0);
        return RL_OK;
    }
    uint32_t used = atomic_load(&h->rows_used), cap = h->row_capacity;
    if (used > cap) {
        note(out, max, found, RL_V_HEADER, used, 0, cap);
        used = cap;
    }
    uint8_t *seen = calloc(used ? used : 1, 1);
    Writers writers; /* read after rows_used: a reservation below it is in its writer's journal */
    if (!seen || writers_read(s, &writers) != RL_OK) {
        free(seen);
        return RL_E_SYS;
    }
    uint64_t gen = atomic_load(&h->index_gen);
    uint32_t b = gen & 1, count = atomic_load(&h->index_count[b]);
    if (count > cap) {
        note(out, max, found, RL_V_HEADER, count, 0, cap);
        count = cap;
    }
    uint64_t prev = 0;
    for (uint32_t i = 0; i < count; i++) {
        uint64_t raw = atomic_load(&s->ikeys[b][i]), key = raw & ~RL_TOMB;
        uint32_t row = atomic_load(&s->irows[b][i]);
        if (i && key < prev) note(out, max, found, RL_V_INDEX_ORDER, row, rl_key_lane(key), i);
        prev = key;
        if (raw & RL_TOMB) continue; /* its row field may hold a jump */
        if (row >= used) {
            note(out, max, found, RL_V_INDEX_ROW, row, rl_key_lane(key), i);
            continue;
        }
        if (!(raw & RL_TOMB) && rl_row_key(s, row) == key) seen[row] = 1;
    }
    for (uint32_t l = 0; l < RL_MAX_LANES; l++) {
        uint32_t st = atomic_load(&h->lane_start[b][l]);
        uint32_t en = atomic_load(&h->lane_start[b][l + 1]);
        if (st > en || en > count || (st < count && rl_key_lane(atomic_load(&s->ikeys[b][st]) & ~RL_TOMB) < l) ||
            (st > 0 && st <= count && rl_key_lane(atomic_load(&s->ikeys[b][st - 1]) & ~RL_TOMB) >= l))
            note(out, max, found, RL_V_LANE_START, 0, l, st);
    }
    uint64_t head = atomic_load(&h->ring_head), tail = atomic_load(&h->ring_tail);
    for (uint64_t pos = head; pos < tail; pos++) {
        rl_ring_slot *slot = &s->ring[pos % h->ring_capacity];
        if (atomic_load(&slot->state) != RL_SLOT(pos, 1)) continue;
        uint64_t key = atomic_load(&slot->key);
        uint32_t row = atomic_load(&slot->row);
        if (row < used && rl_row_key(s, (uint32_t)row) == key) {
            uint32_t l = rl_key_lane(key);
            if (l >= RL_MAX_LANES) continue;
            if (key < RL_RMIN_KEY(atomic_load(&s->lanes[l].ring_min)))
                note(out, max, found, RL_V_RING_MIN, (uint32_t)row, l, key);
            /* Behind its lane's ring hint, an entry is read again only once ring_low is due. */
            uint64_t hint = atomic_load(&s->lanes[l].ring_skip);
            uint64_t at = tail - (uint32_t)((uint32_t)tail - (uint32_t)hint);
            if ((uint32_t)(hint >> 32) != (uint32_t)gen || pos >= at || at > tail ||
                atomic_load(&s->lanes[l].ring_low) <= key)
                seen[row] = 1;
        }
    }
    rows_check(s, used, seen, &writers, out, max, found);
    free(writers.j);
    free(seen);
    return RL_OK;
}

int rl_rows_dump(rl_seg *s, uint32_t start, uint32_t n, uint64_t *words, uint64_t *leases) {
    uint32_t used = atomic_load(&s->h->rows_used);
    if (start > used || n > used - start) return RL_E_RANGE;
    for (uint32_t i = 0; i < n; i++) {
        words[i] = atomic_load_explicit(&s->rows[start + i].word, memory_order_relaxed);
        leases[i] = atomic_load_explicit(&s->rows[start + i].lease, memory_order_relaxed);
    }
    return RL_OK;
}

int rl_rows_export(rl_seg *s, uint32_t start, uint32_t n, int64_t *due_ms, int64_t *interval_s,
                   int64_t *failures, int64_t *provenance, int64_t *urgent, int64_t *lane) {
    uint32_t used = atomic_load(&s->h->rows_used);
    if (start > used || n > used - start) return RL_E_RANGE;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t word = atomic_load_explicit(&s->rows[start + i].word, memory_order_relaxed);
        uint64_t key = RL_WORD_KEY(word);
        due_ms[i] = key == RL_KEY_NONE ? -1 : (int64_t)rl_key_due(key);
        interval_s[i] = atomic_load_explicit(&s->intervals[start + i], memory_order_relaxed);
        failures[i] = RL_WORD_FAILURES(word);
        provenance[i] = RL_WORD_PROV(word);
        urgent[i] = RL_WORD_URGENT(word);
        lane[i] = key == RL_KEY_NONE ? -1 : (int64_t)rl_key_lane(key);
    }
    return RL_OK;
}
