/* Leases: who may render a row, until when, and how a dead holder's rows come back at once.
 *
 * A lease is one 64-bit word per row, [expiry_ms:42][owner:10][tok:12] (csrc/layout.h), taken,
 * renewed and ended by compare-and-swap only. The word itself is the fencing token. A claimer
 * may take a row whose word is free, expired, or held by an owner whose process is gone; the
 * liveness test is kill(pid, 0), memoised per claim pass so a pass pays at most one system call
 * per foreign owner. A reused pid only makes a dead owner look alive, which is the safe side:
 * its rows then come back at expiry instead of at once.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <string.h>

#include "layout.h"

/* memo[o]: 0 unknown, 1 alive, 2 dead; one byte per owner slot, owned by the caller's pass. */
int rl_owner_alive(rl_seg *s, uint32_t o, uint8_t *memo) {
    if (o == 0 || o >= RL_MAX_OWNERS) return 0;
    if (memo && memo[o]) return memo[o] == 1;
    uint64_t w = atomic_load(&s->owners[o].state);
    uint32_t st = RL_OWNER_STATE(w);
    int alive;
    if (st == RL_OWNER_CLAIMING) {
        alive = 1; /* registering right now: its pid is not written yet */
    } else if (st == RL_OWNER_ALIVE) {
        pid_t pid = (pid_t)atomic_load(&s->owners[o].pid);
        alive = !(pid > 0 && kill(pid, 0) != 0 && errno == ESRCH);
        /* Marked against the registration whose pid we read (the word is re-read: a slot that
         * changed hands meanwhile is left alone). */
        if (!alive) {
            if (atomic_load(&s->owners[o].state) == w) rl_owner_mark_dead(s, o, w);
            else alive = 1;
        }
    } else {
        alive = 0; /* DEAD, or FREE: a lease naming a free slot has no holder */
    }
    if (memo) memo[o] = alive ? 1 : 2;
    return alive;
}

int rl_lease_claimable(rl_seg *s, uint64_t w, int64_t now_ms, uint8_t *memo) {
    uint32_t o = RL_LEASE_OWNER(w);
    if (o == 0) return 1;
    if (RL_LEASE_EXPIRY(w) <= now_ms) return 1;
    return !rl_owner_alive(s, o, memo);
}

/* A closing process ends the leases it still holds before giving up its slot, so no newcomer
 * that reuses the slot inherits them. (A killed process is handled by rl_repair instead.) */
int rl_owner_release(rl_seg *s, uint32_t o) {
    if (o == 0 || o >= RL_MAX_OWNERS) return RL_E_RANGE;
    uint32_t used = atomic_load(&s->h->rows_used);
    for (uint32_t r = 0; r < used && r < s->h->row_capacity; r++) {
        uint64_t w = atomic_load_explicit(&s->rows[r].lease, memory_order_relaxed);
        if (RL_LEASE_OWNER(w) == o)
            atomic_compare_exchange_strong(&s->rows[r].lease, &w, RL_LEASE_FREE(w));
    }
    uint64_t held = o;
    atomic_compare_exchange_strong(&s->h->compactor, &held, 0);
    uint64_t w = atomic_load(&s->owners[o].state);
    if (RL_OWNER_STATE(w) == RL_OWNER_ALIVE)
        atomic_compare_exchange_strong(&s->owners[o].state, &w, RL_OWNER_WORD(RL_OWNER_REG(w), RL_OWNER_FREE));
    return RL_OK;
}


/* After a process died: end its leases, rebuild the index from the row table (a writer killed
 * between storing a row's key and appending it to the ring left that row findable only there),
 * lower every floor to its lane's lowest live row, and free the dead owners' slots. */
int rl_repair(rl_seg *s, uint32_t owner, uint32_t *reclaimed) {
    uint32_t n = atomic_load(&s->h->rows_used), count = 0;
    uint8_t dead[RL_MAX_OWNERS];
    uint64_t words[RL_MAX_OWNERS];
    uint32_t lane_min[RL_MAX_LANES];
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
        if (o && dead[o] && atomic_compare_exchange_strong(&s->rows[r].lease, &w, RL_LEASE_FREE(w)))
            count++;
    }
    rc = rl_compact_locked(s, owner, 1, lane_min);
    rl_compactor_release(s, owner);
    for (uint32_t l = 0; l < RL_MAX_LANES; l++)
        if (lane_min[l] != UINT32_MAX) rl_floor_lower(s, l, lane_min[l]);
    for (uint32_t o = 1; o < RL_MAX_OWNERS; o++)
        if (dead[o])
            atomic_compare_exchange_strong(&s->owners[o].state, &words[o],
                                           RL_OWNER_WORD(RL_OWNER_REG(words[o]), RL_OWNER_FREE));
    if (reclaimed) *reclaimed = count;
    return rc;
}
