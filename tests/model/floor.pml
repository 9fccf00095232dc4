/* A model of ONE lane's claim-floor protocol (csrc/floor.c, csrc/claim.c, csrc/writes.c,
 * csrc/index.c), checked by spin through tests/model/check.sh (run by tests/test_model.py).
 *
 * Processes: one writer (NW writes, each a move of a row to a minute, or a remove), NCL
 * claimers (NPASS passes each), and a compactor (NC merges). Every shared word of the C is a
 * variable here and every atomic operation of the C on it is one atomic step, in the C's order:
 *
 *   writer     1. key[r] = m                      (publish_keys' caller stores the row word)
 *              2. reserve a ring slot (CAS on ring_tail), fill + publish it (CAS on its state;
 *                 an abandoned slot is appended again), then CAS-min ring_min
 *              3. rl_floor_lower: load W, then CAS loop W -> [min(minute, m) or 0 : epoch + 1]
 *   claimer    gen = index_gen, count; (a) W = floor; seek (skip hint of this generation, or
 *              lower bound of W's minute); (b) ring_min; scan the index forward; (c) gen moved?
 *              skip-hint CAS forward; CAS W -> [proposal : epoch(W)] only upward
 *   compactor  settle the ring (wait for, or abandon, unpublished slots), merge live index
 *              entries and published ring entries into the other buffer, read ring_min,
 *              publish index_gen, advance ring_head, recompute ring_min from the slots left and
 *              CAS it from the value read, bump the epoch
 *
 * Abstractions (see the report in tests/model/check.sh's header for the reasoning):
 *   - a key is its minute (0..NM-1); keys of one minute are ordered by row. The floor's minute
 *     0 means "no floor" as in the C.
 *   - leases are left out: a leased row keeps its key, so it is live to the scan, which is all
 *     the floor rule looks at; grants never change a key.
 *   - where a pass stops reading the lane (first entry not yet due, window, budget, spill) is a
 *     free choice after any entry: a superset of what the C does.
 *   - ring_collect's candidates only feed grants, never the proposal (which uses ring_min), so
 *     the claimer does not read ring slots.
 *   - the merge reads the row table in one atomic step (the C reads it entry by entry).
 *   - tombstones (rl_index_forget) and full rebuilds are not modelled.
 *
 * The property (DESIGN §8.3, "no stranding"), checked in every reachable state: every live row
 * is at or above its lane's floor, or floor 0, or its write is still between step 1 and the end
 * of step 3 (which will lower the floor to it). At the end no write is pending, so it holds
 * without exception.
 *
 * Deliberately broken variants, each must be caught:
 *   -DBROKEN_RAISE  the claimer's CAS compares only the minute, not the epoch
 *   -DBROKEN_LOWER  the writer lowers the floor without bumping the epoch
 *   -DBROKEN_GEN    the claimer does not re-check the index generation
 */

#ifndef NR
#define NR 2            /* rows */
#endif
#ifndef NM
#define NM 4            /* minutes 0..NM-1 */
#endif
#ifndef NW
#define NW 2            /* writes by the writer */
#endif
#ifndef NC
#define NC 1            /* merges by the compactor */
#endif
#ifndef NPASS
#define NPASS 1         /* claim passes per claimer */
#endif

#define NONE 15         /* RL_KEY_NONE: not queued / nothing seen; above every minute */
#define NI NR           /* index capacity per buffer (row_capacity) */
#define NRING (NW + NC) /* ring slots: every write, plus one re-append per abandonment */

/* ring slot states */
#define UNPUB 0         /* reserved (or never used): its writer has not published it */
#define PUB 1
#define ABANDONED 2

/* ---- shared words ---- */
byte key[NR];                   /* the row table: row words (the truth) */
byte fmin;                      /* floor word, minute half */
byte fep;                       /* floor word, epoch half */
byte ring_min = NONE;           /* lowest key this lane appended since the last merge */
byte ring_head;
byte ring_tail;
byte rs_state[NRING];
byte rs_key[NRING];
byte rs_row[NRING];
byte gen;                       /* index_gen: buffer = gen % 2 */
byte icnt[2];                   /* index_count[2] */
byte ikey[2 * NI];              /* ikeys[buf][i] at [buf * NI + i] */
byte irow[2 * NI];
byte skip_gen;                  /* skip hint [generation : position] */
byte skip_pos;
bool pending[NR];               /* ghost: a write of this row is between step 1 and the end of step 3 */
bool started;                   /* ghost: init done */

#define row_ok(r) (key[r] == NONE || pending[r] || fmin == 0 || key[r] >= fmin)
#if NR == 1
#define INV (row_ok(0))
#elif NR == 2
#define INV (row_ok(0) && row_ok(1))
#elif NR == 3
#define INV (row_ok(0) && row_ok(1) && row_ok(2))
#else
#error "NR must be 1..3"
#endif

ltl no_stranding { [] INV }

/* temporaries of the merge's d_step: not part of the state */
hidden byte tk[NR];
hidden byte tr[NR];
hidden byte ti;
hidden byte tj;
hidden byte tm;
hidden byte tx;

/* ------------------------------------------------------------------ writer ------------- */
proctype writer() {
    byte n, r, m, p, lw_min, lw_ep, next;
    for (n : 1 .. NW) {
        select (r : 0 .. NR - 1);
        select (m : 0 .. NM);           /* NM = remove */
        if
        :: m == NM ->
            /* rl_remove: the key goes, nothing is published, the floor is left alone */
            d_step { key[r] = NONE; r = 0; m = 0 }
        :: else ->
            /* 1. store the row's key */
            d_step { pending[r] = 1; key[r] = m };
            /* 2. rl_ring_append: reserve, fill + publish (again if the merge abandoned it) */
            do
            :: skip;
               d_step { p = ring_tail; ring_tail++ };
               if
               :: d_step { rs_state[p] == UNPUB -> rs_key[p] = m; rs_row[p] = r; rs_state[p] = PUB; p = 0 };
                  break
               :: d_step { rs_state[p] == ABANDONED -> p = 0 }   /* append it again */
               fi
            od;
            skip;
            /*    rl_ring_min_note: a CAS-min loop, one linearization point */
            d_step { if :: m < ring_min -> ring_min = m :: else fi };
            /* 3. rl_floor_lower */
            d_step { lw_min = fmin; lw_ep = fep };
            next = ((lw_min == 0 || lw_min <= m) -> lw_min : m);
            do
            :: d_step {
                 fmin == lw_min && fep == lw_ep ->
                    fmin = next;
#ifndef BROKEN_LOWER
                    fep = lw_ep + 1;
#endif
                    pending[r] = 0;
                    lw_min = 0; lw_ep = 0; next = 0; r = 0; m = 0 };
               break
            :: d_step {
                 !(fmin == lw_min && fep == lw_ep) ->    /* failed CAS: w = the current word */
                    lw_min = fmin; lw_ep = fep;
                    next = ((lw_min == 0 || lw_min <= m) -> lw_min : m) }
            od
        fi
    }
}

/* ------------------------------------------------------------------ claimer ------------ */
proctype claimer() {
    byte n, g, b, cnt, w_min, w_ep, lo, pos, first_live, last_key, rmin, stale_run, k, basis;
    bool live;
    for (n : 1 .. NPASS) {
        skip;   /* (a loop may not jump into a d_step) */
        /* rl_claim: P.gen, P.count of its buffer */
        d_step { g = gen; b = g % 2 };
        d_step { cnt = icnt[b] };
        /* (a) W before the index and the ring */
        d_step { w_min = fmin; w_ep = fep };
        /* the start: this generation's skip hint, else the lower bound of W's minute (the
         * binary search reads immutable entries of a published buffer) */
        d_step {
            if
            :: skip_gen == g && skip_pos <= cnt -> lo = skip_pos
            :: else ->
                lo = 0;
                do
                :: lo < cnt && ikey[b * NI + lo] < w_min -> lo++
                :: else -> break
                od
            fi;
            pos = lo; stale_run = lo; first_live = NONE; last_key = NONE
        };
        /* (b) ring_min after W */
        d_step { rmin = ring_min };
        /* idx_advance: read forward; the pass may stop after any entry */
        do
        :: pos < cnt ->
            d_step {
                k = ikey[b * NI + pos];
                live = (key[irow[b * NI + pos]] == k);
                pos++;
                last_key = k;
                if :: live && first_live == NONE -> first_live = k :: else fi;
                if :: !live && stale_run == pos - 1 -> stale_run = pos :: else fi;
                k = 0; live = 0
            }
        :: break
        od;
        /* floors_raise: (c) re-check the generation */
#ifndef BROKEN_GEN
        if
        :: d_step { gen != g -> skip }
        :: d_step { gen == g -> skip };
#else
        if
        :: true ->
#endif
            /* the skip hint moves forward within a generation (a CAS loop, one linearization) */
            d_step {
                if
                :: skip_gen != g || skip_pos < stale_run -> skip_gen = g; skip_pos = stale_run
                :: else
                fi };
            basis = (first_live != NONE -> first_live : last_key);
            if
            :: basis != NONE ->
                basis = (rmin < basis -> rmin : basis);
                /* rl_floor_raise: only upward, CAS on the whole word seen in (a) */
                if
                :: basis > w_min ->
                    d_step {
#ifndef BROKEN_RAISE
                        if :: fmin == w_min && fep == w_ep -> fmin = basis :: else fi
#else
                        if :: fmin == w_min -> fmin = basis :: else fi
#endif
                    }
                :: else
                fi
            :: else
            fi
        fi;
        d_step { g = 0; b = 0; cnt = 0; w_min = 0; w_ep = 0; lo = 0; pos = 0; first_live = 0;
                 last_key = 0; rmin = 0; stale_run = 0; basis = 0 }
    }
}

/* ------------------------------------------------------------------ compactor ---------- */
proctype compactor() {
    byte n, g, head, tail, upto, old_min, new_min, tail_now, p;
    for (n : 1 .. NC) {
        skip;   /* (a loop may not jump into a d_step) */
        d_step { g = gen };
        d_step { head = ring_head };
        d_step { tail = ring_tail };
        /* ring_settle: wait for each slot to be published, or abandon it (its writer appends
         * it again) */
        upto = head;
        do
        :: upto < tail ->
            if
            :: d_step { rs_state[upto] != UNPUB -> upto++ }
            :: d_step { rs_state[upto] == UNPUB -> rs_state[upto] = ABANDONED }
            fi
        :: else -> break
        od;
        skip;
        /* the merge into the other buffer: live entries of this generation and the published
         * ring entries [head, upto) whose row still has that key, sorted by (key, row) */
        d_step {
            tm = 0;
            ti = 0;
            do
            :: ti < icnt[g % 2] ->
                tx = irow[(g % 2) * NI + ti];
                if
                :: key[tx] == ikey[(g % 2) * NI + ti] -> tk[tm] = key[tx]; tr[tm] = tx; tm++
                :: else
                fi;
                ti++
            :: else -> break
            od;
            ti = head;
            do
            :: ti < upto ->
                tx = rs_row[ti];
                if
                :: rs_state[ti] == PUB && key[tx] == rs_key[ti] ->
                    tj = 0;
                    do
                    :: tj < tm && tr[tj] != tx -> tj++
                    :: else -> break
                    od;
                    if :: tj == tm -> tk[tm] = key[tx]; tr[tm] = tx; tm++ :: else fi
                :: else
                fi;
                ti++
            :: else -> break
            od;
            /* insertion sort by (key, row), then write the destination buffer */
            ti = 1;
            do
            :: ti < tm ->
                tj = ti;
                do
                :: tj > 0 && (tk[tj - 1] > tk[tj] || (tk[tj - 1] == tk[tj] && tr[tj - 1] > tr[tj])) ->
                    tx = tk[tj]; tk[tj] = tk[tj - 1]; tk[tj - 1] = tx;
                    tx = tr[tj]; tr[tj] = tr[tj - 1]; tr[tj - 1] = tx;
                    tj--
                :: else -> break
                od;
                ti++
            :: else -> break
            od;
            ti = 0;
            do
            :: ti < NI ->
                if
                :: ti < tm -> ikey[((g + 1) % 2) * NI + ti] = tk[ti]; irow[((g + 1) % 2) * NI + ti] = tr[ti]
                :: else -> ikey[((g + 1) % 2) * NI + ti] = 0; irow[((g + 1) % 2) * NI + ti] = 0
                fi;
                ti++
            :: else -> break
            od;
            icnt[(g + 1) % 2] = tm;
            ti = 0; tj = 0; tm = 0; tx = 0
        };
        d_step { old_min = ring_min };
        d_step { gen = g + 1 };                 /* publish */
        d_step { ring_head = upto };
        /* ring_min now covers only what is left in the ring */
        new_min = NONE;
        d_step { tail_now = ring_tail };
        p = upto;
        do
        :: p < tail_now ->
            if
            :: d_step { rs_state[p] == ABANDONED -> p++ }
            :: d_step { rs_state[p] == UNPUB -> new_min = old_min; p = tail_now }  /* still being written */
            :: d_step { rs_state[p] == PUB -> if :: rs_key[p] < new_min -> new_min = rs_key[p] :: else fi; p++ }
            fi
        :: else -> break
        od;
        if
        :: new_min != old_min -> d_step { if :: ring_min == old_min -> ring_min = new_min :: else fi }
        :: else
        fi;
        /* rl_floor_bump_all: a CAS loop, one linearization point */
        d_step { fep++ };
        d_step { g = 0; head = 0; tail = 0; upto = 0; old_min = 0; new_min = 0; tail_now = 0; p = 0 }
    }
}

/* ------------------------------------------------------------------ start -------------- */
/* Any initial row table (each row at a minute, or not queued), indexed in generation 0, an
 * empty ring, no floor. */
init {
    byte r, m;
    for (r : 0 .. NR - 1) {
        select (m : 0 .. NM);
        key[r] = (m == NM -> NONE : m)
    };
    skip;   /* (the loop's exit may not jump into a d_step) */
    d_step {
        tm = 0;
        for (ti : 0 .. NR - 1) {
            if
            :: key[ti] != NONE ->
                tj = tm;
                do
                :: tj > 0 && tk[tj - 1] > key[ti] -> tk[tj] = tk[tj - 1]; tr[tj] = tr[tj - 1]; tj--
                :: else -> break
                od;
                tk[tj] = key[ti]; tr[tj] = ti; tm++
            :: else
            fi
        };
        for (ti : 0 .. NR - 1) {
            if :: ti < tm -> ikey[ti] = tk[ti]; irow[ti] = tr[ti] :: else fi
        };
        icnt[0] = tm;
        ti = 0; tj = 0; tm = 0; r = 0; m = 0;
        started = 1
    };
    atomic {
        run writer();
        run claimer();
        run claimer();
        run compactor()
    }
}
