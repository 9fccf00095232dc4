/* Leases: who may render a row, until when, and how the leases of an owner that is gone end.
 *
 * A lease is one 64-bit word per row, [expiry_ms:42][owner:10][tok:12] (csrc/layout.h), taken,
 * renewed and ended by compare-and-swap only. The word itself is the fencing token. A claimer
 * may take a row whose word is free, expired, or held by an owner whose process is gone
 * (csrc/owners.c decides that). A closing process ends its own leases (rl_owner_release); a
 * killed one's are reclaimed by rl_repair, and before that by the sweep (csrc/sweep.c).
 * docs/design.md §5, §9.
 */
#define _GNU_SOURCE
#include <string.h>

#include "layout.h"

int rl_lease_claimable(rl_seg *s, uint64_t w, int64_t now_ms, uint8_t *memo) {
    uint32_t o = RL_LEASE_OWNER(w);
    if (o == 0) return 1;
    if (RL_LEASE_EXPIRY(w) <= now_ms) return 1;
    return !rl_owner_alive(s, o, memo);
}

/* Put back the rows of a batch of leases that are still taken out (FLIGHT), then free the
 * leases. */
static void leases_end(rl_seg *s, uint32_t o, uint32_t n, const uint32_t *rows,
                       const uint64_t *words, uint64_t *leases) {
    uint32_t back[64], m = 0;
    uint64_t flying[64];
    for (uint32_t i = 0; i < n; i++)
        if (words[i] & RL_WORD_FLIGHT) {
            back[m] = rows[i];
            flying[m++] = words[i];
        }
    if (m) (void)rl_flight_return(s, o, m, back, flying, NULL);
    for (uint32_t i = 0; i < n; i++)
        if (atomic_compare_exchange_strong(&s->rows[rows[i]].lease, &leases[i], RL_LEASE_FREE(leases[i])))
            rl_lease_freed(s, rows[i]);
}

/* A closing process ends the leases it still holds before giving up its slot, so no newcomer
 * that reuses the slot inherits them, and puts back the rows they took out (csrc/sweep.c).
 * (A killed process is handled by the sweep and rl_repair instead.) */
int rl_owner_release(rl_seg *s, uint32_t o) {
    if (o == 0 || o >= RL_MAX_OWNERS) return RL_E_RANGE;
    uint32_t used = atomic_load(&s->h->rows_used);
    if (used > s->h->row_capacity) used = s->h->row_capacity;
    uint32_t rows[64], n = 0;
    uint64_t words[64], leases[64];
    for (uint32_t r = 0; r < used; r++) {
        uint64_t w = atomic_load_explicit(&s->rows[r].lease, memory_order_relaxed);
        if (RL_LEASE_OWNER(w) != o) continue;
        rows[n] = r;
        leases[n] = w;
        words[n++] = atomic_load(&s->rows[r].word);
        if (n == 64) {
            leases_end(s, o, n, rows, words, leases);
            n = 0;
        }
    }
    leases_end(s, o, n, rows, words, leases);
    rl_owner_unregister(s, o);
    return RL_OK;
}


/* After a process died: end its leases, take back the rows it reserved and never wrote
 * (csrc/writes.c, rl_reserved_settle), rebuild the index from the row table (a writer killed
 * between storing a row's key and appending it to the ring left that row findable only there),
 * lower every floor to its lane's lowest live row, and free the dead owners' slots (their write
 * journals cleared: nothing of theirs is half done any more). */
int rl_repair_report(rl_seg *s, uint32_t owner, rl_repair_out *out) {
    uint32_t n = atomic_load(&s->h->rows_used);
    uint8_t dead[RL_MAX_OWNERS];
    uint64_t words[RL_MAX_OWNERS];
    uint32_t lane_min[RL_MAX_LANES];
    memset(out, 0, sizeof *out);
    if (n > s->h->row_capacity) n = s->h->row_capacity;
    int rc = rl_compactor_acquire(s, owner);
    if (rc != RL_OK) return rc;
    atomic_store(&s->h->repair_needed, 0);
    for (uint32_t o = 0; o < RL_MAX_OWNERS; o++) {
        words[o] = atomic_load(&s->owners[o].state);
        dead[o] = RL_OWNER_STATE(words[o]) == RL_OWNER_DEAD;
    }
    for (uint32_t r = 0; r < n; r++) {
        uint64_t w = atomic_load(&s->rows[r].lease);
        uint32_t o = RL_LEASE_OWNER(w);
        if (o && dead[o] && atomic_compare_exchange_strong(&s->rows[r].lease, &w, RL_LEASE_FREE(w))) {
            /* Freed, so the full rebuild below indexes it: it is no longer in flight. */
            atomic_fetch_and(&s->rows[r].word, ~RL_WORD_FLIGHT);
            out->reclaimed++;
        }
    }
    rl_reserved_settle(s, n, out);
    rc = rl_compact_locked(s, 1, lane_min);
    rl_compactor_release(s, owner);
    for (uint32_t l = 0; l < RL_MAX_LANES; l++)
        if (lane_min[l] != UINT32_MAX) rl_floor_lower(s, l, lane_min[l]);
    for (uint32_t o = 1; o < RL_MAX_OWNERS; o++) {
        if (!dead[o]) continue;
        for (int j = 0; j < RL_OWNER_WRITES; j++) atomic_store(&s->owners[o].writes[j], 0);
        atomic_compare_exchange_strong(&s->owners[o].state, &words[o],
                                       RL_OWNER_WORD(RL_OWNER_REG(words[o]), RL_OWNER_FREE));
    }
    return rc;
}

int rl_repair(rl_seg *s, uint32_t owner, uint32_t *reclaimed) {
    rl_repair_out out;
    int rc = rl_repair_report(s, owner, &out);
    if (reclaimed) *reclaimed = out.reclaimed;
    return rc;
}
