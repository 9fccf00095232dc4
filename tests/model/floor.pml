/* A model of ONE lane's claim-floor protocol, checked by spin: tests/model/check.sh, run by
 * tests/test_model.py in `make test`. The protocol is stated at the top of csrc/floor.c; the
 * code modelled is rl_floor_lower / rl_floor_raise / rl_floor_bump_all (csrc/floor.c),
 * rl_claim's P.gen, lane_open, idx_advance and floors_raise (csrc/claim.c), publish_keys
 * (csrc/writes.c), rl_ring_append, rl_ring_min_note and rl_compact_locked (csrc/index.c).
 * Change them together.
 *
 * Processes: one writer (NW writes, each moving a row to a minute, or removing it: the key goes,
 * then a (NONE, row) slot is appended to the ring, no ring_min note, no floor step), NCL
 * claimers (NPASS passes each) and a compactor (NC merges). Each shared word of the C is a
 * variable here, and each atomic operation of the C on it is one atomic step (a d_step), in the
 * C's order:
 *
 *   writer     1. the row's key: key[r] = m
 *              2. rl_ring_append: reserve a slot (CAS on ring_tail); fill and publish it (CAS
 *                 on its state; a slot the merge abandoned meanwhile is appended again); then
 *                 rl_ring_min_note, a CAS-min on ring_min
 *              3. rl_floor_lower: W -> [min(W's minute, m), or 0 if it was 0 : epoch + 1]
 *   claimer    P.gen; (a) W; the start: this generation's skip hint, else the lower bound of
 *              W's minute; (b) ring_min; idx_advance: entries forward, each a load of its row's
 *              key; (c) if index_gen moved, nothing more; else the skip hint CAS (forward
 *              only), then rl_floor_raise: if the proposal, min(first live key, else the last
 *              key read; ring_min), is above W's minute, CAS the whole word W -> [proposal :
 *              epoch(W)]
 *   compactor  ring_settle: wait for each slot of [head, tail) to be published, or abandon it;
 *              the merge into the other buffer of this generation's entries (an entry whose row
 *              no published slot of [head, upto) names is kept unread, unless a slot there was
 *              abandoned; the others only if live) and the live published ring entries; load ring_min; publish index_gen and ring_head; load
 *              ring_tail; the new ring_min from the slots left (the old one if one of them is
 *              still being written); CAS ring_min from the value loaded; rl_floor_bump_all
 *
 * Abstractions (each keeps every behaviour of the C that can matter to the floor):
 *   - a key is its minute, 0..NM-1; keys of one minute are ordered by row. Minute 0 of the
 *     floor is "no floor", as in the C.
 *   - leases are left out: a leased row keeps its key, so it is live to the scan, which is all
 *     that the floor rule looks at, and no grant changes a key.
 *   - where a pass stops reading (the first entry not yet due, the window, the budget, the next
 *     lane) is a free choice after any entry: a superset of what the C does. A pass stops at
 *     the first live entry: after it, first_live and stale_run are settled and last_key is not
 *     used, so the rest of the scan cannot change what the pass writes.
 *   - ring_collect's candidates feed grants only, never the proposal (ring_min does), so the
 *     claimer does not read ring slots.
 *   - the claimer reads its buffer's count and entries where it uses them, not with P.gen: a
 *     buffer is rewritten only for generation gen + 2, after gen has moved, and a pass that
 *     sees gen move at (c) writes nothing.
 *   - CAS loops whose new value is a function of the value the CAS finds (rl_floor_lower,
 *     rl_ring_min_note, rl_floor_bump_all, the skip hint) are one atomic read-modify-write at
 *     their successful CAS: a failed CAS changes nothing. -DLITERAL_CAS_LOOPS models
 *     rl_floor_lower's loop step by step instead.
 *   - the merge reads the row table in one step (the C reads it entry by entry); index_gen and
 *     ring_head are written by the compactor only, so its own loads of them are not steps.
 *   - not modelled: tombstones (rl_index_forget), full rebuilds, batches of several rows, a
 *     ring that wraps.
 *
 * The property, docs/design.md §14, "no live row is ever below its lane's floor", in every reachable
 * state: every live row is at or above the floor's minute, or the floor is 0, or the row's
 * write is between its step 1 and the end of its step 3 (the ghost pending[r]: step 3 will
 * lower the floor to it). Only a step that changes key[], pending[] or the floor can falsify
 * it, and each of those asserts it (CHECK). When every process has ended no write is pending,
 * and every queued row is findable at its key in the index or the ring (the end check).
 *
 * Bounds: the defaults (one write, two claimers, a compactor, rows starting at minutes 1 and
 * 2) verify in seconds; check.sh also runs -DNC=0 -DNW=2 -DANY_START (no compactor, two
 * writes, any start) and -DNCL=1 -DNW=2 (one claimer, two writes, a compactor). All of it at
 * once (-DNW=2) is past 300 s and 8 GB.
 *
 * Switches:
 *   -DBROKEN_RAISE  broken: the claimer's CAS compares the floor's minute only, not the epoch
 *   -DBROKEN_LOWER  broken: the writer lowers the floor without bumping the epoch
 *   -DBROKEN_GEN    broken: the claimer does not re-check the index generation at (c)
 *   -DBROKEN_PROPOSAL  broken: the proposal ignores ring_min (recent writes below the first
 *                   live index entry); the one-line change the stateful test also catches
 *   -DREACH_TOP     sanity: asserts that the floor never reaches minute NM - 1 (raises happen)
 *   -DBROKEN_FRESH  broken: the merge drops the ring's entries (and still moves ring_head), so
 *                   a moved row is in neither the index nor the ring (the end check)
 *   -DBROKEN_RING_MIN  broken (the C before the fix this model found): ring_min carries no
 *                   version, so a note that does not lower it leaves the merge's reset CAS
 *                   to succeed and the slot behind it uncovered
 */

#ifndef NR
#define NR 2            /* rows (1..3) */
#endif
#ifndef NM
#define NM 3            /* minutes 0..NM-1 */
#endif
#ifndef NW
#define NW 1            /* writes by the writer */
#endif
#ifndef NC
#define NC 1            /* merges by the compactor (0: no compactor) */
#endif
#ifndef NCL
#define NCL 2           /* claimers (1..2) */
#endif
#ifndef NPASS
#define NPASS 1         /* claim passes per claimer */
#endif

#define NONE 15         /* RL_KEY_NONE: not queued / nothing seen; above every minute */
#define NI NR           /* index capacity of a buffer: row_capacity */
#if NC > 0
#define NRING (NW + NC) /* ring slots: one per write, one more per abandoned slot */
#else
#define NRING NW
#endif

/* ring slot states */
#define UNPUB 0         /* unused, or reserved and not yet published by its writer */
#define PUB 1
#define ABANDONED 2

/* ---- shared words ---- */
byte key[NR];                   /* the row table: each row's key (the truth) */
byte fmin;                      /* the floor word: [minute ... */
byte fep;                       /*                  ... : epoch] */
byte ring_min = NONE;           /* the lane's lowest key appended since the last merge */
#ifndef BROKEN_RING_MIN
byte ring_ver;                  /* a version in ring_min's word, moved by every note */
#endif
byte ring_head;
byte ring_tail;
byte rs_state[NRING];           /* ring slots */
byte rs_key[NRING];
byte rs_row[NRING];
byte gen;                       /* index_gen; its buffer is gen % 2 */
byte icnt[2];                   /* index_count[buffer] */
byte ikey[2 * NI];              /* buffer b, position i at b * NI + i */
byte irow[2 * NI];
byte skip_gen;                  /* the lane's skip hint: [generation : position] */
byte skip_pos;
bit pending[NR];                /* ghost: a write of this row is between step 1 and step 3's end */

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
#ifndef REACH_TOP
#define CHECK assert(INV)
#else
/* A sanity run, expected to fail: the floor never reaches the top minute. Its counterexample
 * shows that raises happen, so the property above is not true for want of any. */
#define CHECK assert(INV && fmin < NM - 1)
#endif

/* for the trails: element i of a row-sized array, or 15 past its end */
#define SHOWN(a, i) (i < NR -> a[(i < NR -> i : 0)] : 15)

/* temporaries of the merge's d_step only: not part of the state */
hidden byte tk[NR];
hidden byte tr[NR];
hidden byte ti;
hidden byte tj;
hidden byte tm;
hidden byte tx;
hidden byte tmoved[NR];         /* rows a published slot of [head, upto) names */
hidden byte tall;               /* a slot of [head, upto) was abandoned: re-read every row */

/* ------------------------------------------------------------------ writer ------------- */
proctype writer() {
    byte n, r, m, p;
#ifdef LITERAL_CAS_LOOPS
    byte lw_min, lw_ep, next;
#endif
    for (n : 1 .. NW) {
        select (r : 0 .. NR - 1);
        select (m : 0 .. NM);           /* m == NM: remove */
        if
        :: m == NM ->
            /* rl_remove: the key goes, then (NONE, row) is appended to the ring so that the
             * next merge re-reads the row; no ring_min note, the floor is left alone */
            d_step { key[r] = NONE; CHECK; printf("MSC: writer: remove row %d\n", r) };
            do
            :: skip;
               d_step { p = ring_tail; ring_tail++; printf("MSC: writer: remove: reserve slot %d\n", p) };
               if
               :: d_step { rs_state[p] == UNPUB ->
                               rs_key[p] = NONE; rs_row[p] = r; rs_state[p] = PUB;
                               printf("MSC: writer: remove: publish slot %d = (NONE, row %d)\n", p, r); p = 0 };
                  break
               :: d_step { rs_state[p] == ABANDONED -> printf("MSC: writer: slot %d abandoned\n", p); p = 0 }
               fi
            od;
            r = 0; m = 0
        :: else ->
            /* 1. the row's key */
            d_step { pending[r] = 1; key[r] = m; CHECK; printf("MSC: writer: 1. key[%d] = %d\n", r, m) };
            /* 2. rl_ring_append */
            do
            :: skip;
               d_step { p = ring_tail; ring_tail++; printf("MSC: writer: 2. reserve slot %d\n", p) };
               if
               :: d_step { rs_state[p] == UNPUB ->               /* fill, publish */
                               rs_key[p] = m; rs_row[p] = r; rs_state[p] = PUB;
                               printf("MSC: writer: 2. publish slot %d = (%d, row %d)\n", p, m, r); p = 0 };
                  break
               :: d_step { rs_state[p] == ABANDONED -> printf("MSC: writer: slot %d abandoned\n", p); p = 0 }
               fi
            od;
            skip;
            /*    rl_ring_min_note: a CAS-min loop, one linearization point */
            d_step {
#ifndef BROKEN_RING_MIN
                ring_ver++;                                   /* the CAS always succeeds once */
#endif
                if :: m < ring_min -> ring_min = m :: else fi; printf("MSC: writer: 2. ring_min note %d: ring_min = %d\n", m, ring_min) };
            /* 3. rl_floor_lower */
#ifdef LITERAL_CAS_LOOPS
            d_step {
                lw_min = fmin; lw_ep = fep;
                next = ((lw_min == 0 || lw_min <= m) -> lw_min : m) };
            do
            :: d_step {
                   fmin == lw_min && fep == lw_ep ->
                       fmin = next;
#ifndef BROKEN_LOWER
                       fep = lw_ep + 1;
#endif
                       pending[r] = 0;
                       CHECK;
                       printf("MSC: writer: 3. floor lowered to [%d:%d]\n", fmin, fep);
                       lw_min = 0; lw_ep = 0; next = 0; r = 0; m = 0 };
               break
            :: d_step {
                   !(fmin == lw_min && fep == lw_ep) ->      /* failed: w = the word now */
                       lw_min = fmin; lw_ep = fep;
                       next = ((lw_min == 0 || lw_min <= m) -> lw_min : m) }
            od
#else
            /* The CAS loop computes the new word from the one its CAS finds, and a failed CAS
             * changes nothing: the loop is one atomic read-modify-write at its successful CAS
             * (build with -DLITERAL_CAS_LOOPS for the loop step by step). */
            d_step {
                fmin = ((fmin == 0 || fmin <= m) -> fmin : m);
#ifndef BROKEN_LOWER
                fep++;
#endif
                pending[r] = 0;
                CHECK;
                printf("MSC: writer: 3. floor lowered to [%d:%d]\n", fmin, fep);
                r = 0; m = 0 }
#endif
        fi
    }
}

/* ------------------------------------------------------------------ claimer ------------ */
proctype claimer() {
    /* The pass keeps what the C's cursor keeps, in less: it stops reading at the first live
     * entry (after it, first_live and stale_run are settled and last_key is not used), so
     * last_key is the key at pos - 1 when any entry was read, and stale_run is pos, or pos - 1
     * when the last entry read was live. */
    byte n, g, w_min, w_ep, pos, rmin, prop;
    bit any, found;
    for (n : 1 .. NPASS) {
        skip;
        /* rl_claim: P.gen (the buffer's count and entries are read where they are used: they
         * cannot change while gen is still g, and if gen moved the pass does nothing) */
        d_step { g = gen; printf("MSC: claimer %d: P.gen = %d\n", _pid, g) };
        /* lane_open: (a) W, before the index and the ring */
        d_step { w_min = fmin; w_ep = fep; printf("MSC: claimer %d: (a) W = [%d:%d]\n", _pid, w_min, w_ep) };
        /* the start: this generation's skip hint, else the lower bound of W's minute */
        d_step {
            if
            :: skip_gen == g && skip_pos <= icnt[g % 2] -> pos = skip_pos
            :: else ->
                pos = 0;
                do
                :: pos < icnt[g % 2] && ikey[(g % 2) * NI + pos] < w_min -> pos++
                :: else -> break
                od
            fi;
            printf("MSC: claimer %d: start at entry %d (skip hint [%d:%d])\n", _pid, pos, skip_gen, skip_pos)
        };
        /* (b) ring_min, after W */
        d_step { rmin = ring_min; printf("MSC: claimer %d: (b) ring_min = %d\n", _pid, rmin) };
        /* idx_advance: entries forward, each a load of its row's key; the pass may stop after
         * any of them (not due, window, budget) */
        do
        :: d_step {
                pos < icnt[g % 2] && !found ->
                found = (key[irow[(g % 2) * NI + pos]] == ikey[(g % 2) * NI + pos]);
                printf("MSC: claimer %d: read entry (%d, row %d): %d\n", _pid,
                       ikey[(g % 2) * NI + pos], irow[(g % 2) * NI + pos], found);
                pos++;
                any = 1 }
        :: break
        od;
        /* floors_raise (each step also forgets what the rest of the pass no longer needs) */
#ifndef BROKEN_GEN
        if
        :: d_step { gen != g ->                                 /* (c) moved: nothing */
                        printf("MSC: claimer %d: (c) generation moved: no raise\n", _pid);
                        g = 0; w_min = 0; w_ep = 0; pos = 0; rmin = 0; any = 0; found = 0 }
        :: d_step { gen == g ->
#else
        if
        :: d_step { true ->                                     /* no (c) */
#endif
                        /* the proposal: first live key, else the last key read; then the
                         * minimum with ring_min */
                        prop = (any -> ikey[(g % 2) * NI + pos - 1] : NONE);
#ifndef BROKEN_PROPOSAL
                        prop = (prop != NONE && rmin < prop -> rmin : prop);
#endif
                        rmin = 0; any = 0 };
            /* the skip hint, forward only within a generation (a CAS loop) */
            d_step {
                if
                :: skip_gen != g || skip_pos < pos - found -> skip_gen = g; skip_pos = pos - found
                :: else
                fi;
                if
                :: prop == NONE || prop <= w_min -> prop = 0; w_min = 0; w_ep = 0   /* no raise */
                :: else
                fi;
                g = 0; pos = 0; found = 0 };
            if
            :: prop != 0 ->
                /* rl_floor_raise: only upward, CAS on the whole word seen at (a) */
                d_step {
#ifndef BROKEN_RAISE
                    if :: fmin == w_min && fep == w_ep -> fmin = prop :: else fi;
#else
                    if :: fmin == w_min -> fmin = prop :: else fi;      /* the epoch is ignored */
#endif
                    printf("MSC: claimer %d: raise CAS [%d:%d] -> [%d:%d]: floor now [%d:%d]\n",
                           _pid, w_min, w_ep, prop, w_ep, fmin, fep);
                    CHECK;
                    prop = 0; w_min = 0; w_ep = 0 }
            :: else
            fi
        fi
    }
}

#if NC > 0
/* ------------------------------------------------------------------ compactor ---------- */
proctype compactor() {
    byte n, g, head, tail, upto, old_min, new_min, p;
#ifndef BROKEN_RING_MIN
    byte old_ver;
#endif
    for (n : 1 .. NC) {
        skip;
        d_step { g = gen; head = ring_head; tail = ring_tail; upto = head; printf("MSC: compactor: gen %d, ring [%d, %d)\n", g, head, tail) };
        /* ring_settle */
        do
        :: upto < tail ->
            if
            :: d_step { rs_state[upto] != UNPUB -> upto++ }
            :: d_step { rs_state[upto] == UNPUB -> rs_state[upto] = ABANDONED; printf("MSC: compactor: abandon slot %d\n", upto) }
            fi
        :: else -> break
        od;
        skip;
        /* the merge: the entries of generation g (kept unread when no published slot of
         * [head, upto) names their row and none there was abandoned, else only if live) and
         * the live published ring entries of [head, upto), without duplicates, sorted by
         * (key, row), into buffer (g + 1) % 2 */
        d_step {
            tall = 0;
            for (ti : 0 .. NR - 1) { tmoved[ti] = 0 };
            ti = head;
            do
            :: ti < upto ->
                if
                :: rs_state[ti] == PUB -> tmoved[rs_row[ti]] = 1
                :: else -> tall = 1
                fi;
                ti++
            :: else -> break
            od;
            tm = 0;
            ti = 0;
            do
            :: ti < icnt[g % 2] ->
                tx = irow[(g % 2) * NI + ti];
                if
                :: (!tall && !tmoved[tx]) || key[tx] == ikey[(g % 2) * NI + ti] ->
                    tk[tm] = ikey[(g % 2) * NI + ti]; tr[tm] = tx; tm++
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
#ifndef BROKEN_FRESH
                :: rs_state[ti] == PUB && rs_key[ti] != NONE && key[tx] == rs_key[ti] ->
#else
                :: false ->     /* broken: the merge takes no ring entry, yet moves ring_head */
#endif
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
            printf("MSC: compactor: merged into buffer %d: %d entries, keys %d %d %d, rows %d %d %d\n",
                   (g + 1) % 2, tm, SHOWN(tk, 0), SHOWN(tk, 1), SHOWN(tk, 2),
                   SHOWN(tr, 0), SHOWN(tr, 1), SHOWN(tr, 2));
            ti = 0; tj = 0; tm = 0; tx = 0; tall = 0;
            for (ti : 0 .. NR - 1) { tmoved[ti] = 0 };
            ti = 0
        };
        d_step {
            old_min = ring_min;
#ifndef BROKEN_RING_MIN
            old_ver = ring_ver;
#endif
            printf("MSC: compactor: old ring_min = %d\n", old_min) };
        d_step { gen = g + 1; ring_head = upto; printf("MSC: compactor: publish gen %d, ring_head = %d\n", gen, upto) };
        /* ring_min now covers only the slots left: [upto, ring_tail) */
        d_step { tail = ring_tail; new_min = NONE; p = upto; printf("MSC: compactor: ring_tail = %d\n", tail) };
        do
        :: p < tail ->
            if
            :: d_step { rs_state[p] == ABANDONED -> p++ }
            :: d_step { rs_state[p] == PUB ->
                            if :: rs_key[p] < new_min -> new_min = rs_key[p] :: else fi; p++ }
            :: d_step { rs_state[p] == UNPUB -> new_min = old_min; p = tail }   /* being written */
            fi
        :: else -> break
        od;
        /* The CAS from the word loaded before the tail. Every rl_ring_min_note moves the word's
         * version, so after any note since that load the CAS fails and ring_min keeps a value
         * at or below the new slot's key. Without the version (-DBROKEN_RING_MIN, as the C was
         * until this model found it) a note that found ring_min already at or below its key
         * changed nothing, the CAS succeeded, and ring_min no longer covered that slot. */
        if
        :: new_min != old_min ->
#ifndef BROKEN_RING_MIN
            d_step { if :: ring_min == old_min && ring_ver == old_ver -> ring_min = new_min :: else fi;
#else
            d_step { if :: ring_min == old_min -> ring_min = new_min :: else fi;
#endif
                     printf("MSC: compactor: ring_min CAS %d -> %d: ring_min now %d\n", old_min, new_min, ring_min) }
        :: else
        fi;
        d_step {
            fep++;
            printf("MSC: compactor: epoch bumped: floor [%d:%d]\n", fmin, fep);
            g = 0; head = 0; tail = 0; upto = 0; old_min = 0; new_min = 0; p = 0;
#ifndef BROKEN_RING_MIN
            old_ver = 0
#endif
        }
    }
}

#endif

/* ------------------------------------------------------------------ start -------------- */
/* The rows at minutes 1 and 2 (-DANY_START: any row table, each row at a minute or not
 * queued), indexed as generation 0; an empty ring; no floor. */
init {
    byte r, m;
#ifndef ANY_START
    for (r : 0 .. NR - 1) { key[r] = (r + 1) % NM };
#else
    /* rows are alike but for their order among equal keys: start them in key order */
    for (r : 0 .. NR - 1) {
        if
        :: r > 0 && key[r - 1] == NONE -> key[r] = NONE
        :: else ->
            select (m : (r == 0 -> 0 : key[r - 1]) .. NM);     /* NM: not queued */
            key[r] = (m == NM -> NONE : m)
        fi
    };
#endif
    skip;
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
        CHECK;
        printf("MSC: start: row keys %d %d %d (15: not queued, or no such row), floor [0:0]\n",
               SHOWN(key, 0), SHOWN(key, 1), SHOWN(key, 2))
    };
    atomic {
        run writer();
        run claimer();
#if NCL > 1
        run claimer();
#endif
#if NC > 0
        run compactor()
#endif
    };
    /* When every process has ended: every queued row is findable, at its key, in the index of
     * the current generation or in a published slot of the ring that is left (docs/design.md §6: recent
     * writes visible to claims at once; a merge never loses a live row). */
    (_nr_pr == 1);
    d_step {
        for (ti : 0 .. NR - 1) {
            if
            :: key[ti] != NONE ->
                tm = 0;
                for (tj : 0 .. NI - 1) {
                    if
                    :: tj < icnt[gen % 2] && irow[(gen % 2) * NI + tj] == ti &&
                       ikey[(gen % 2) * NI + tj] == key[ti] -> tm = 1
                    :: else
                    fi
                };
                tj = ring_head;
                do
                :: tj < ring_tail ->
                    if :: rs_state[tj] == PUB && rs_row[tj] == ti && rs_key[tj] == key[ti] -> tm = 1 :: else fi;
                    tj++
                :: else -> break
                od;
                if :: tm == 0 -> printf("MSC: end: row %d (key %d) is in neither the index nor the ring\n", ti, key[ti]) :: else fi;
                assert(tm == 1)
            :: else
            fi
        }
    }
}
