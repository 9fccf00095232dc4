/* A model of ONE lane's claim-floor protocol and of the rows-in-flight protocol (rows granted
 * are taken out of the index and put back when their lease ends), checked by spin:
 * tests/model/check.sh, run by tests/test_model.py in `make test`. The floor protocol is stated
 * at the top of csrc/floor.c, rows in flight at the top of csrc/sweep.c; the code modelled is
 * rl_floor_lower / rl_floor_raise / rl_floor_bump_all (csrc/floor.c), rl_claim's P.gen and
 * P.now, lane_open, idx_advance, lane_take_one, notes_flush and floors_raise (csrc/claim.c),
 * rl_index_tomb, rl_ring_append, rl_ring_min_note and rl_compact_locked (csrc/index.c),
 * rl_publish, rl_complete_many, rl_release, rl_remove (csrc/writes.c), rl_lease_min_note,
 * rl_flight_return and rl_sweep_if_due (csrc/sweep.c). Change them together.
 *
 * Processes: a writer (NW writes, each moving a row to a minute, or removing it), NCL claimers
 * (NPASS passes each; with -DLEASES each pass may grant one row, and the claimer then ends that
 * lease as its holder would), a compactor (NC merges), and with -DLEASES a sweeper (NSW sweeps)
 * and a clock (now = 0 .. NT - 1). Each shared word of the C is a variable here, and each atomic
 * operation of the C on it is one atomic step (a d_step), in the C's order:
 *
 *   writer     1. the row's word: key[r] = m, FLIGHT cleared (a new word, as rl_prioritize
 *                 stores; -DWRITER_KEEPS_FLIGHT keeps the bit, as rl_restamp's CAS does)
 *              2. rl_ring_append: reserve a slot (CAS on ring_tail); fill and publish it (CAS
 *                 on its state; a slot the merge abandoned meanwhile is appended again); then
 *                 rl_ring_min_note, a CAS-min on ring_min that always moves its version
 *              3. rl_floor_lower: W -> [min(W's minute, m), or 0 if it was 0 : epoch + 1]
 *              a removal: the key goes (NONE, no FLIGHT), any lease ends, then a (NONE, row)
 *              slot is appended to the ring; no ring_min note, no floor step
 *   claimer    P.gen, P.now; (a) W; the start: this generation's skip hint if its pass read a
 *              floor minute at or below W's, else the lower bound of W's minute; (b) ring_min
 *              (and ring_collect's window of slots); idx_advance: entries forward, each a load
 *              of its row's word and, if FLIGHT, then of its lease: a tombstone is skipped
 *              unread, an entry whose row's key differs (stale) or whose row is FLIGHT with a
 *              lease not claimable at P.now (held in flight) is skipped and noted for a
 *              tombstone, any other is live and ends the scan;
 *              a grant (at most one a pass), of the live entry the scan stopped at or, at any
 *              point of the scan, of a published ring slot: (i) the lease CAS (free, or expired
 *              at P.now -> [me : P.now + LEASE]); (ii) the row's key re-read: unchanged, or
 *              moved and still due (a free choice), goes on; moved or gone gives the lease back;
 *              (iii) FLIGHT set (fetch_or);
 *              notes_flush: (iv) rl_lease_min_note of the lease's expiry, then (v) rl_index_tomb:
 *              if the generation is still P.gen (the owner's hazard), every noted entry and the
 *              granted one become tombstones;
 *              floors_raise: (c) if index_gen moved, nothing more; else the skip hint CAS
 *              (forward only, with the floor minute its pass read), then rl_floor_raise: if the
 *              proposal, min(first live key, else the last key read; ring_min), is above W's
 *              minute, CAS the whole word W -> [proposal : epoch(W)];
 *              then, as the lease's holder: complete (lease -> "writing" word; a new word, no
 *              FLIGHT; append + ring_min note; floor lower; lease freed), release (lease ->
 *              "writing"; if FLIGHT: clear it, append the unchanged key + ring_min note, floor
 *              lower; lease freed), or neither (the lease lapses at its expiry). After freeing a
 *              lease word (also when (ii) gives one back), a row found FLIGHT makes its freer
 *              note 0 in lease_min, so that a sweep is due (see -DNO_END_RECHECK).
 *   sweeper    rl_sweep_if_due: if lease_min is [not sweeping : ms <= now], CAS it to
 *              [sweeping : HORIZON]; walk the rows (each: its word, then if FLIGHT its lease);
 *              rl_flight_return for the FLIGHT rows whose lease was claimable (CAS-clear FLIGHT
 *              where the word is still the one read, then append each, one ring_min note, one
 *              floor lower), the least expiry of the others kept; then lease_min -> [not
 *              sweeping : min(that, its ms)].
 *   compactor  ring_settle: wait for each slot of [head, tail) to be published, or abandon it;
 *              the merge into the other buffer of this generation's entries but its tombstones
 *              (an entry whose row no published slot of [head, upto) names is kept unread,
 *              unless a slot there was abandoned; the others only if wanted) and the wanted
 *              published ring entries: wanted = at that key, and not FLIGHT with a lease (any
 *              owner: csrc/index.c row_wanted); load ring_min; publish index_gen and ring_head;
 *              load ring_tail; the new ring_min from the slots left (the old one if one of them
 *              is still being written); CAS ring_min from the value loaded; rl_floor_bump_all
 *   clock      now++, NT - 1 times, between any two steps of the others
 *
 * Abstractions (each keeps every behaviour of the C that can matter to the properties):
 *   - a key is its minute, 0..NM-1; keys of one minute are ordered by row. Minute 0 of the
 *     floor is "no floor", as in the C. Every key is due (a grant's (ii) may find the row moved
 *     and still due, or give it back: both are explored).
 *   - time is a small counter; every lease is LEASE = 1 long, so a grant at now t expires at
 *     t + 1, and HORIZON (the "writing" word's expiry, lease_min's "none") is NT + LEASE. A
 *     lease word is [owner : expiry]: the tok field only tells apart two leases of one owner,
 *     and a claimer here holds one lease at a time. Owners do not die (see "not modelled").
 *   - where a pass stops reading (the first entry not yet due, the window, the budget, the next
 *     lane) is a free choice after any entry: a superset of what the C does. A pass stops at
 *     the first live entry: after it, first_live and stale_run are settled and last_key is not
 *     used, so the rest of the scan cannot change what the pass writes to the floor; it grants
 *     at most one row (that entry, or any published ring slot of its window, taken at any point
 *     of the scan), and a grant given back at (ii) is not followed by another.
 *   - the claimer reads its buffer's count and entries where it uses them, not with P.gen: a
 *     buffer is rewritten only for generation gen + 2, after gen has moved, and a pass that
 *     sees gen move at (c) writes nothing to the floor (its tombstones are gen-checked).
 *   - CAS loops whose new value is a function of the value the CAS finds (rl_floor_lower,
 *     rl_ring_min_note, rl_floor_bump_all, the skip hint, rl_lease_min_note, the sweep's start
 *     and end) are one atomic read-modify-write at their successful CAS: a failed CAS changes
 *     nothing, and no versions are needed in lease_min here (they make the C's CASes succeed
 *     exactly when these steps apply). -DLITERAL_CAS_LOOPS models rl_floor_lower's loop step by
 *     step instead. A lease CAS from the word a pass read, with the claimable test on that
 *     word, is one step: a CAS that succeeds found the word read.
 *   - lease_begin_write's CAS to "writing" and its load of the key (removed: give it back) are
 *     one step: a removal also ends the lease, so one in between ends as one before the CAS.
 *   - release's load of the row word and rl_flight_return's CAS-clear are one step: what
 *     changes the word between them (a store, a put-back) clears FLIGHT, so the CAS fails
 *     exactly when a later load would have found no FLIGHT (-DWRITER_KEEPS_FLIGHT splits them).
 *     The re-read of the row word after a lease is freed, and its note, are one step: a FLIGHT
 *     set after the read is covered by the note of the grant that set it.
 *   - (c) and the skip hint CAS are one step: a merge in between only leaves a hint of a
 *     generation no later pass uses. Without a compactor a ring append is one step (a slot
 *     reserved and not yet published is read by the merge only).
 *   - the merge reads the row table in one step (the C reads it entry by entry); index_gen and
 *     ring_head are written by the compactor only, so its own loads of them are not steps. An
 *     entry the merge keeps and should not have is harmless (every reader re-checks the row);
 *     one it drops for a FLIGHT row with a lease is put back through the ring by whatever ends
 *     that lease, after it clears FLIGHT, so a later read of the row could only keep more.
 *   - not modelled: owner deaths (marking one dead notes 0, as a lapse makes a sweep due),
 *     rl_renew, a sweeper's takeover and two sweeps at once, full rebuilds (rl_repair), batches
 *     of several rows, a ring that wraps, the ring hint (ring_skip / ring_low) of csrc/claim.c
 *     (so not ring_collect reading rows_used again for a slot naming a row past P.used: the
 *     same race by the ring, held by tests/shm/test_fork.py).
 *
 * The property, in every reachable state, for every row r: r is not queued; or r is FLIGHT
 * and its lease is held (not claimable at now), and then it is covered: ms(lease_min) <= its
 * expiry, or a sweep runs whose walk has not yet read r, or read it claimable and will put it
 * back, or whose least expiry so far is <= r's, or r's grant has set FLIGHT and not yet noted
 * its expiry; or else (r not held in flight) a publication of r's current key is under way
 * (between the store of its key or the clear of its FLIGHT and the end of the floor lower that
 * follows: the ghosts wp_*, hp_*, sp_*), or r is at or above the floor's minute (or the floor
 * is 0: docs/design.md §14 "no live row is ever below its lane's floor"), or r is FLIGHT with a
 * claimable lease and covered, which for a claimable lease means a sweep is due (ms <= now).
 * Only a step that changes what the property reads can falsify it, and each of those asserts
 * it (CHECK). When every process has ended, every queued row is held in flight, or FLIGHT with
 * a claimable lease and a sweep due (that final sweep puts it back), or findable at its key in
 * the index of the current generation (not a tombstone, not before a skip hint a pass at the
 * floor would use) or in a published slot of the ring that is left, and not below the floor
 * (the end check).
 *
 * Bounds: NR = 2 rows (at minutes 1 and 2), NM = 3 minutes, NT = 2 clock values, one grant a
 * pass. check.sh runs the searches it lists (about two minutes on two cores); each adds one
 * process or pass to a search that stays under ~30M states. Past the budget, and checked once
 * by hand: two claimers, leases and a compactor with ring grants (-DLEASES -DNW=0 -DNCL=2 -DNC=1
 * -DNR=1 -DENDS=2, 64M states), three clock values (-DLEASES -DNW=0 -DNCL=2 -DNC=0 -DNT=3, 68M),
 * two sweeps (... -DNSW=2, 29M). A writer, two claimers, leases and a compactor at once is past
 * 130M states and 8 GB.
 *
 * Switches (the fixes this model found are the defaults; the variants they fixed are kept):
 *   -DLEASES        grants, lease ends, the sweeper and the clock (off: no row is ever leased)
 *   -DRING_GRANTS=0 grants from the index only; -DENDS=n the lease ends a holder may choose
 *                   (1 complete, 2 release, 4 lapse; default 7): narrower searches
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
 *   -DBROKEN_HINT   broken (the C before the fix this model found): a pass starts at the skip
 *                   hint whatever the floor did since it was recorded. A write stores a key
 *                   below the floor and appends it; a merge puts it in the index; a pass (at
 *                   the old floor) records the hint past it; the write lowers the floor; the
 *                   next pass starts at the hint, never reads the row, and raises the floor
 *                   over it. Fixed: the hint carries the floor minute its pass read, and a pass
 *                   whose W is below that minute seeks instead.
 *   -DADDS          the last row starts not yet added (rows_used = NR - 1); the writer's first
 *                   write adds it: the CAS on rows_used, then the steps of any write. A pass
 *                   reads P.used after P.gen, and an index entry of a row at or past it reads as
 *                   not queued (not live, no tombstone), as in idx_advance
 *   -DBROKEN_USED_FIRST  broken (the C before the fix this model confirmed, found by the fork
 *                   stress test): P.used is read before P.gen. A row is added and merged into
 *                   the next generation meanwhile; the pass reads its entry as not queued, and
 *                   records the skip hint past it (and may raise the floor over it): no pass
 *                   finds it until the next merge
 *   -DBROKEN_RELEASE   broken: release frees the lease and puts nothing back (FLIGHT stays)
 *   -DBROKEN_REPUBLISH broken: a put-back (release, sweep) appends but does not lower the floor
 *   -DBROKEN_SWEEP_MIN broken: the sweep's end stores its own least expiry, losing the notes
 *                   made during the sweep
 *   -DBROKEN_FLIGHT_ORDER broken: the grant tombstones its entry before setting FLIGHT
 *   -DBROKEN_NOTE_ORDER   broken: the grant notes lease_min before setting FLIGHT
 *   -DRELEASE_PUBLISH_FIRST, -DSWEEP_PUBLISH_FIRST (both: -DREPUBLISH_FIRST)  broken (the
 *                   protocol as first written): release, and the sweep, append the row's key
 *                   and lower the floor, then clear FLIGHT; a merge in between sees a FLIGHT
 *                   row with a lease (the releaser's "writing" word, or the lapsed one) and
 *                   drops the new ring entry, and the row is in neither the index nor the ring
 *   -DNO_END_RECHECK broken (the protocol as first written): nothing looks at FLIGHT after a
 *                   lease is freed. A grant whose lease lapsed between its CAS and its
 *                   fetch_or, and was taken and released by another claimer meanwhile, sets
 *                   FLIGHT on a row it no longer holds; a sweep reads it FLIGHT under the
 *                   releaser's "writing" word (held, until HORIZON); a merge drops the release's
 *                   ring entry; the release frees the lease: the row is FLIGHT, free, nowhere,
 *                   and lease_min says no sweep is due. (Re-reading the lease before a CAS of
 *                   FLIGHT is not enough: release restores the very word the stale grant read.)
 *   -DWRITER_KEEPS_FLIGHT  the writer's new word keeps FLIGHT (rl_restamp's CAS)
 */

#ifndef NR
#define NR 2            /* rows (1..3) */
#endif
#ifndef NM
#define NM 3            /* minutes 0..NM-1 */
#endif
#ifndef NW
#define NW 1            /* writes by the writer (0: no writer) */
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
#ifdef REPUBLISH_FIRST          /* the protocol as first written, both places */
#define RELEASE_PUBLISH_FIRST
#define SWEEP_PUBLISH_FIRST
#endif
#ifdef LEASES
#define GRANTS 1        /* passes grant (one row each), holders end leases, a sweeper sweeps */
#ifndef RING_GRANTS
#define RING_GRANTS 1   /* 0: grants from the index only (a narrower search) */
#endif
#ifndef ENDS
#define ENDS 7          /* lease ends a holder may choose: 1 complete, 2 release, 4 lapse */
#endif
#ifndef NSW
#define NSW 1           /* sweeps the sweeper may run (0: no sweeper) */
#endif
#ifndef NT
#define NT 2            /* lease clock: now = 0..NT-1 */
#endif
#else
#define GRANTS 0
#undef NSW
#define NSW 0
#undef NT
#define NT 1
#endif
#define LEASE 1         /* a grant at now t leases until t + LEASE */
#define HZ (NT + LEASE) /* RL_HORIZON: above every expiry; a "writing" word expires at HZ */

#define NONE 15         /* RL_KEY_NONE: not queued / nothing seen; above every minute */
#define TOMB 16         /* an index entry's tombstone bit (RL_TOMB) */
#define NOPOS 7         /* a candidate's index position when it came from the ring */
#define NI NR           /* index capacity of a buffer: row_capacity */

/* ring slots: one per append (a write, a lease end, a sweep's put-back), and one more per
 * appender and merge (a slot the merge abandons is appended again) */
#if NW > 0
#define NAPW 1
#else
#define NAPW 0
#endif
#if NSW > 0
#define NAPS 1
#else
#define NAPS 0
#endif
#if GRANTS
#define NRING (NW + NCL * NPASS + NSW * NR + NC * (NAPW + NCL + NAPS))
#else
#define NRING (NW + NC * NAPW)
#endif

/* ring slot states */
#define UNPUB 0         /* unused, or reserved and not yet published by its writer */
#define PUB 1
#define ABANDONED 2

/* ---- shared words ---- */
byte key[NR];                   /* the row table: each row's key (the truth) ... */
bit flight[NR];                 /* ... and its FLIGHT bit, one word */
byte lown[NR];                  /* each row's lease word: [owner (0: free) ... */
byte lexp[NR];                  /*                         ... : expiry (HZ: "writing")] */
byte now;                       /* the lease clock */
bit lm_sw;                      /* lease_min: [sweeping ... */
byte lm_ms = HZ;                /*             ... : ms] */
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
#ifdef ADDS
byte used = NR - 1;             /* rows_used: the last row is not yet added */
#define SEEN(r) ((r) < pused)   /* a row the pass's P.used covers (csrc/claim.c idx_advance) */
#else
#define SEEN(r) 1
#endif
#ifdef ADDS
#define PUSED_RESET pused = 0
#else
#define PUSED_RESET skip
#endif
byte icnt[2];                   /* index_count[buffer] */
byte ikey[2 * NI];              /* buffer b, position i at b * NI + i; key | TOMB */
byte irow[2 * NI];
byte skip_gen;                  /* the lane's skip hint: [generation : position ... */
byte skip_pos;
#ifndef BROKEN_HINT
byte skip_min;                  /*                   ... : the floor minute its pass read] */
#endif

/* ---- the sweeper's walk, global only so that the property can read it ---- */
byte sw_pos;                    /* the next row the walk reads */
byte sw_m;                      /* least expiry of the held FLIGHT leases it read */
bit sw_sel[NR];                 /* read claimable: to be put back (its CAS not yet tried) */
byte sw_wk[NR];                 /* the key of the row word it read */

/* ---- ghosts ---- */
bit wp_on;                      /* the writer's write of (row wp_r, key wp_k) is between its */
byte wp_r;                      /* key store and the end of its floor lower */
byte wp_k;
bit hp_on[2];                   /* the same for claimer i's lease end (complete, release) */
byte hp_r[2];
byte hp_k[2];
bit sp_on[NR];                  /* the same for the sweep's put-back of a row */
byte sp_k[NR];
bit nt_on[2];                   /* claimer i set FLIGHT on row nt_r[i] and has not yet noted */
byte nt_r[2];                   /* its lease's expiry in lease_min */

#define IK(b, i) ikey[(b) * NI + (i)]
#define IR(b, i) irow[(b) * NI + (i)]
#define CLAIMABLE(r, t) (lown[r] == 0 || lexp[r] <= (t))
/* the merge keeps an entry only if its row is not FLIGHT with a lease (csrc/index.c row_wanted) */
#define WANTED(r) (!(flight[r] && lown[r] != 0))

/* The property. A row is fine when it is not queued, or a publication of its current key is
 * under way (PEND: between the store of its key or the clear of its FLIGHT, and the end of the
 * floor lower that follows), or it is at or above the floor (or the floor is 0), or it is
 * FLIGHT and covered by lease_min. Covered: a FLIGHT row whose lease is held must have
 * ms(lease_min) <= its expiry; one whose lease is claimable (expired, or free) must have
 * ms <= now, i.e. a sweep is due; while a sweep runs, a row its walk has not yet read, or read
 * claimable and will put back, is covered, and so is one whose expiry is >= the least the walk
 * collected; and between setting FLIGHT and noting the lease's expiry, the grant covers it. */
#define REQ(r) (CLAIMABLE(r, now) -> now : lexp[r])
#if NCL > 1
#define NOTING(r) ((nt_on[0] && nt_r[0] == r) || (nt_on[1] && nt_r[1] == r))
#define HPEND(r) ((hp_on[0] && hp_r[0] == r && hp_k[0] == key[r]) || (hp_on[1] && hp_r[1] == r && hp_k[1] == key[r]))
#else
#define NOTING(r) (nt_on[0] && nt_r[0] == r)
#define HPEND(r) (hp_on[0] && hp_r[0] == r && hp_k[0] == key[r])
#endif
#define PEND(r) ((wp_on && wp_r == r && wp_k == key[r]) || HPEND(r) || (sp_on[r] && sp_k[r] == key[r]))
#define COVERED(r) (NOTING(r) || lm_ms <= REQ(r) || (lm_sw && (sw_pos <= r || sw_sel[r] || sw_m <= REQ(r))))
#define HELD(r) (flight[r] && !CLAIMABLE(r, now))
#define row_ok(r) (key[r] == NONE || \
                   (HELD(r) -> COVERED(r) : (PEND(r) || fmin == 0 || key[r] >= fmin || (flight[r] && COVERED(r)))))
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
#define PROPERTY INV
#else
/* A sanity run, expected to fail: the floor never reaches the top minute. Its counterexample
 * shows that raises happen, so the property above is not true for want of any. */
#define PROPERTY (INV && fmin < NM - 1)
#endif
hidden byte holds;              /* the property, computed where it is checked */
#define CHECK holds = PROPERTY; \
    if \
    :: !holds -> printf("MSC: PROPERTY FAILS: keys %d %d, FLIGHT %d %d, leases [%d:%d] [%d:%d], floor [%d:%d], lease_min [%d:%d], now %d\n", \
                        key[0], SHOWN(key, 1), flight[0], SHOWN(flight, 1), lown[0], lexp[0], SHOWN(lown, 1), SHOWN(lexp, 1), \
                        fmin, fep, lm_sw, lm_ms, now) \
    :: else \
    fi; \
    assert(holds)

/* for the trails: element i of a row-sized array, or 15 past its end */
#define SHOWN(a, i) (i < NR -> a[(i < NR -> i : 0)] : 15)

/* temporaries of d_steps only: not part of the state */
hidden byte tk[NR];
hidden byte tr[NR];
hidden byte ti;
hidden byte tj;
hidden byte tm;
hidden byte tx;
hidden byte tmoved[NR];         /* rows a published slot of [head, upto) names */
hidden byte tall;               /* a slot of [head, upto) was abandoned: re-read every row */

/* rl_ring_append of (K, R): reserve a slot (CAS on ring_tail); fill and publish it (CAS on its
 * state; a slot the merge abandoned meanwhile is appended again). P: a scratch local. */
#if NC > 0
inline ring_append(K, R, P) {
    do
    :: skip;
       d_step { assert(ring_tail < NRING); P = ring_tail; ring_tail++;
                printf("MSC: [%d] reserve slot %d\n", _pid, P) };
       if
       :: d_step { rs_state[P] == UNPUB ->
                       rs_key[P] = K; rs_row[P] = R; rs_state[P] = PUB;
                       printf("MSC: [%d] publish slot %d = (%d, row %d)\n", _pid, P, K, R); P = 0 };
          break
       :: d_step { rs_state[P] == ABANDONED -> printf("MSC: [%d] slot %d abandoned\n", _pid, P); P = 0 }
       fi
    od;
    skip        /* the break's target: not the first statement of a d_step */
}
#else
/* no merge abandons a slot: reserve, fill and publish are one step (a slot reserved and not
 * yet published is read by nobody but the merge) */
inline ring_append(K, R, P) {
    d_step { assert(ring_tail < NRING); rs_key[ring_tail] = K; rs_row[ring_tail] = R; rs_state[ring_tail] = PUB;
             printf("MSC: [%d] append slot %d = (%d, row %d)\n", _pid, ring_tail, K, R); ring_tail++ }
}
#endif

/* rl_ring_min_note: a CAS-min loop that always moves the version, one linearization point */
#ifndef BROKEN_RING_MIN
#define RMIN_NOTE(K) ring_ver++; if :: (K) < ring_min -> ring_min = (K) :: else fi
#else
#define RMIN_NOTE(K) if :: (K) < ring_min -> ring_min = (K) :: else fi
#endif
/* After freeing a lease word: if the row is FLIGHT (set by a grant whose lease had already
 * lapsed and been taken: a stale fetch_or), note 0 in lease_min, so that a sweep is due. */
#ifndef NO_END_RECHECK
#define END_RECHECK(R) if :: flight[R] && lm_ms > 0 -> lm_ms = 0; printf("MSC: [%d] row %d is FLIGHT after its lease ended: lease_min note 0\n", _pid, R) :: else fi
#else
#define END_RECHECK(R) skip
#endif
/* rl_floor_lower: one read-modify-write at its successful CAS */
#define FLOOR_LOWER(M) fmin = ((fmin == 0 || fmin <= (M)) -> fmin : (M)); fep++

#if NW > 0
/* ------------------------------------------------------------------ writer ------------- */
proctype writer() {
    byte n, r, m, p;
#ifdef LITERAL_CAS_LOOPS
    byte lw_min, lw_ep, next;
#endif
    for (n : 1 .. NW) {
#ifdef ADDS
        if
        :: n == 1 ->
            /* rl_add_many of the last row: reserve it (the CAS on rows_used), then as any
             * write (its key, the ring, the floor) */
            r = NR - 1;
            select (m : 0 .. NM - 1);
            skip;               /* the select's break target: not the first step of a d_step */
            d_step { used++; printf("MSC: writer: 0. add: rows_used = %d\n", used) }
        :: n > 1 ->
            select (r : 0 .. NR - 1);
            select (m : 0 .. NM)        /* m == NM: remove */
        fi;
#else
        select (r : 0 .. NR - 1);
        select (m : 0 .. NM);           /* m == NM: remove */
#endif
        if
        :: m == NM ->
            /* rl_remove: the key goes (the new word has no FLIGHT), any lease ends, then
             * (NONE, row) is appended to the ring so that the next merge re-reads the row; no
             * ring_min note, the floor is left alone */
            d_step { key[r] = NONE; flight[r] = 0; printf("MSC: writer: remove row %d\n", r); CHECK };
            d_step { lown[r] = 0; lexp[r] = 0; printf("MSC: writer: remove: lease of row %d ended\n", r); CHECK };
            ring_append(NONE, r, p);
            r = 0; m = 0
        :: else ->
            /* 1. the row's key (prioritize: a new word, FLIGHT clear; -DWRITER_KEEPS_FLIGHT:
             *    the bit kept, as restamp's CAS does) */
            d_step { wp_on = 1; wp_r = r; wp_k = m; key[r] = m;
#ifndef WRITER_KEEPS_FLIGHT
                     flight[r] = 0;
#endif
                     printf("MSC: writer: 1. key[%d] = %d\n", r, m); CHECK };
            /* 2. rl_ring_append, then rl_ring_min_note */
            ring_append(m, r, p);
            d_step { RMIN_NOTE(m); printf("MSC: writer: 2. ring_min note %d: ring_min = %d\n", m, ring_min) };
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
                       wp_on = 0; wp_r = 0; wp_k = 0;
                       printf("MSC: writer: 3. floor lowered to [%d:%d]\n", fmin, fep);
                       CHECK;
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
                wp_on = 0; wp_r = 0; wp_k = 0;
                printf("MSC: writer: 3. floor lowered to [%d:%d]\n", fmin, fep);
                CHECK;
                r = 0; m = 0 }
#endif
        fi
    }
}

#endif

/* ------------------------------------------------------------------ claimer ------------ */
#if GRANTS
#ifndef BROKEN_NOTE_ORDER
#define NOTE_GHOST 1
#else
#define NOTE_GHOST 0    /* noted already */
#endif
/* The grant after (i), the lease CAS: (ii) re-check the row's key: unchanged, or moved and
 * still due (a free choice), goes on; moved, or gone, gives the lease back; (iii) FLIGHT. The
 * note (iv) and the tombstone (v) come at the end of the pass, as in the C (notes_flush). */
inline grant_rest() {
    if
    :: d_step { key[cr] == ck -> st = 2; printf("MSC: claimer %d: (ii) row %d still at %d\n", me, cr, ck); ck = 0; pnow = 0; rh = 0; rt = 0 }
    :: d_step { key[cr] != ck && key[cr] != NONE -> st = 2; printf("MSC: claimer %d: (ii) row %d moved to %d, still due\n", me, cr, key[cr]); ck = 0; pnow = 0; rh = 0; rt = 0 }
    :: d_step { key[cr] != ck ->
                    if :: lown[cr] == me && lexp[cr] == cexp -> lown[cr] = 0; lexp[cr] = 0 :: else fi;
                    END_RECHECK(cr);
                    printf("MSC: claimer %d: (ii) row %d moved to %d: lease given back\n", me, cr, key[cr]);
                    CHECK;
                    st = 3; cr = 0; ck = 0; cexp = 0; cp = 0; pnow = 0; rh = 0; rt = 0 }
    fi;
#ifdef BROKEN_FLIGHT_ORDER
    /* broken: the entry is tombstoned before FLIGHT is set and the lease noted */
    if
    :: st == 2 && cp != NOPOS ->
        d_step { if :: gen == g -> IK(g % 2, cp) = IK(g % 2, cp) | TOMB :: else fi;
                 printf("MSC: claimer %d: (v) BROKEN: entry %d tombstoned before FLIGHT\n", me, cp) }
    :: else
    fi;
#endif
#ifdef BROKEN_NOTE_ORDER
    /* broken: the lease is noted in lease_min before FLIGHT is set */
    if
    :: st == 2 -> d_step { if :: cexp < lm_ms -> lm_ms = cexp :: else fi; printf("MSC: claimer %d: (iv) BROKEN: note %d before FLIGHT: lease_min [%d:%d]\n", me, cexp, lm_sw, lm_ms);
                           CHECK }
    :: else
    fi;
#endif
    /* (iii) FLIGHT: fetch_or on the row word (key untouched) */
    if
    :: st == 2 ->
        d_step { flight[cr] = 1; nt_on[me - 1] = NOTE_GHOST; nt_r[me - 1] = cr;
                 if :: cp != NOPOS -> tmask = tmask | (1 << cp) :: else fi;
                 printf("MSC: claimer %d: (iii) FLIGHT set on row %d\n", me, cr); CHECK; cp = 0 }
    :: else
    fi
}

/* a grant from ring slot I: (i) the lease CAS, from a claimable word read with the candidate
 * (one step: a CAS that succeeds found the word the pass read) */
#define RING_GRANT(I) \
    :: d_step { st == 0 && !fl && (I) >= rh && (I) < rt && rs_state[I] == PUB && rs_key[I] != NONE && \
                CLAIMABLE(rs_row[I], pnow) -> \
                    cp = NOPOS; cr = rs_row[I]; ck = rs_key[I]; cexp = pnow + LEASE; \
                    lown[cr] = me; lexp[cr] = cexp; st = 1; CHECK; \
                    printf("MSC: claimer %d: (i) lease row %d from ring slot %d (key %d) until %d\n", me, cr, I, ck, cexp) }; \
       grant_rest()

/* the put-back of a lease end (release), in the protocol's write order:
 * clear FLIGHT (the "key store"), append + ring_min note, lower the floor */
inline republish(R, K, P) {
    ring_append(K, R, P);
    d_step { RMIN_NOTE(K); printf("MSC: claimer %d: ring_min note %d: ring_min = %d\n", me, K, ring_min) };
#ifndef BROKEN_REPUBLISH
    d_step { FLOOR_LOWER(K); hp_on[me - 1] = 0; hp_r[me - 1] = 0; hp_k[me - 1] = 0; printf("MSC: claimer %d: floor lowered to [%d:%d]\n", me, fmin, fep);
             CHECK }
#else
    d_step { hp_on[me - 1] = 0; hp_r[me - 1] = 0; hp_k[me - 1] = 0; printf("MSC: claimer %d: BROKEN: no floor lower\n", me);
             CHECK }
#endif
}
#endif

#if GRANTS
#define FL fl
/* what only the scan and the grant use, dead once the pass gets to floors_raise */
#define RESET_PASS st = 0; cr = 0; ck = 0; cp = 0; cexp = 0; wk = 0; m = 0; hw = 0; pnow = 0; rh = 0; rt = 0
#define ZERO_GRANT_SCRATCH pnow = 0; rh = 0; rt = 0; if :: st != 2 -> cr = 0; cexp = 0 :: else fi; ck = 0; cp = 0
#else
#define FL 0
#define ZERO_GRANT_SCRATCH skip
#endif
proctype claimer(byte me) {
    /* The pass keeps what the C's cursor keeps, in less: it stops reading at the first live
     * entry (after it, first_live and stale_run are settled and last_key is not used), so
     * last_key is the key at pos - 1 when any entry was read, and stale_run is pos, or pos - 1
     * when the last entry read was live. */
    byte n, g, w_min, w_ep, pos, rmin, prop;
#ifdef ADDS
    byte pused;                 /* P.used: rows at or past it read as not queued */
#endif
    bit any, found;
#if GRANTS
    byte pnow, rh, rt, tmask, st, cr, ck, cp, cexp, wk, m, p;
    bit fl, hw;
#else
    byte tmask;
#endif
    for (n : 1 .. NPASS) {
        skip;
        /* rl_claim: P.now, P.gen (the buffer's count and entries are read where they are used:
         * they cannot change while gen is still g, and if gen moved the pass does nothing) */
#if defined(ADDS) && defined(BROKEN_USED_FIRST)
        /* broken (the C before the fix this model found): P.used before P.gen */
        d_step { pused = used; printf("MSC: claimer %d: BROKEN: P.used = %d, before P.gen\n", me, pused) };
#endif
        d_step { g = gen;
#if GRANTS
                 pnow = now;
#endif
                 printf("MSC: claimer %d: P.gen = %d\n", me, g) };
#if defined(ADDS) && !defined(BROKEN_USED_FIRST)
        /* P.used after P.gen: every row the generation's index names is below it (the merge
         * read rows_used before it published the generation) */
        d_step { pused = used; printf("MSC: claimer %d: P.used = %d\n", me, pused) };
#endif
        /* lane_open: (a) W, before the index and the ring */
        d_step { w_min = fmin; w_ep = fep; printf("MSC: claimer %d: (a) W = [%d:%d]\n", me, w_min, w_ep) };
        /* the start: this generation's skip hint, else the lower bound of W's minute */
        d_step {
            if
#ifndef BROKEN_HINT
            :: skip_gen == g && skip_pos <= icnt[g % 2] && w_min >= skip_min -> pos = skip_pos
#else
            :: skip_gen == g && skip_pos <= icnt[g % 2] -> pos = skip_pos     /* whatever the floor did */
#endif
            :: else ->
                pos = 0;
                do
                :: pos < icnt[g % 2] && (IK(g % 2, pos) & ~TOMB) < w_min -> pos++
                :: else -> break
                od
            fi;
            printf("MSC: claimer %d: start at entry %d (skip hint [%d:%d])\n", me, pos, skip_gen, skip_pos)
        };
        /* (b) ring_min, after W; ring_collect's window of slots */
        d_step { rmin = ring_min;
#if GRANTS
                 rh = ring_head; rt = ring_tail;
#endif
                 printf("MSC: claimer %d: (b) ring_min = %d\n", me, rmin) };
        /* idx_advance: entries forward; the pass may stop after any of them (not due, window,
         * budget). An entry is a tombstone (skipped unread), stale (its row's key differs), held
         * in flight (its row is FLIGHT: the lease word is read next, and not claimable), or
         * live. Stale and held entries are noted for tombstoning. A grant from the ring may
         * come between any two reads. */
        do
        :: d_step {
                pos < icnt[g % 2] && !found && !FL ->
                tx = IR(g % 2, pos);
                if
                :: IK(g % 2, pos) & TOMB -> skip
                :: else ->
                    if
#ifdef ADDS
                    :: !SEEN(tx) -> skip        /* read as not queued: not live, no tombstone */
#endif
                    :: SEEN(tx) && key[tx] != IK(g % 2, pos) -> tmask = tmask | (1 << pos)
                    :: SEEN(tx) && key[tx] == IK(g % 2, pos) && !flight[tx] -> found = 1
#if GRANTS
                    :: SEEN(tx) && key[tx] == IK(g % 2, pos) && flight[tx] -> fl = 1
#else
                    :: SEEN(tx) && key[tx] == IK(g % 2, pos) && flight[tx] -> tmask = tmask | (1 << pos)
#endif
                    fi
                fi;
#if GRANTS
                if :: found -> cp = pos; cr = tx; ck = IK(g % 2, pos) & ~TOMB :: else fi;
#endif
                printf("MSC: claimer %d: read entry %d (%d, row %d): row key %d, FLIGHT %d\n", me, pos,
                       IK(g % 2, pos), tx, key[tx], flight[tx]);
                pos++;
                any = 1;
                tx = 0 }
#if GRANTS
        :: d_step {
                fl ->
                tx = IR(g % 2, pos - 1);
                if
                :: CLAIMABLE(tx, pnow) -> found = 1; cp = pos - 1; cr = tx; ck = IK(g % 2, pos - 1) & ~TOMB
                :: else -> tmask = tmask | (1 << (pos - 1))
                fi;
                printf("MSC: claimer %d: lease of row %d: [%d:%d]: %d\n", me, tx, lown[tx], lexp[tx], found);
                fl = 0; tx = 0 }
        /* a grant from the ring (ring_collect's candidates) */
#if RING_GRANTS
        RING_GRANT(0)
#if NRING > 1
        RING_GRANT(1)
#endif
#if NRING > 2
        RING_GRANT(2)
#endif
#if NRING > 3
        RING_GRANT(3)
#endif
#if NRING > 4
        RING_GRANT(4)
#endif
#if NRING > 5
        RING_GRANT(5)
#endif
#if NRING > 6
        RING_GRANT(6)
#endif
#if NRING > 7
        RING_GRANT(7)
#endif
#if NRING > 8
        RING_GRANT(8)
#endif
#if NRING > 9
        RING_GRANT(9)
#endif
#if NRING > 10
#error "NRING > 10: add RING_GRANT lines"
#endif
#endif
        :: !fl -> break
#else
        :: break
#endif
        od;
#if GRANTS
        /* a grant of the live entry the scan stopped at (the pass may also take none) */
        if
        :: d_step { found && st == 0 && CLAIMABLE(cr, pnow) ->
                        cexp = pnow + LEASE; lown[cr] = me; lexp[cr] = cexp; st = 1; printf("MSC: claimer %d: (i) lease row %d from entry %d (key %d) until %d\n", me, cr, cp, ck, cexp);
                        CHECK };
           grant_rest()
        :: skip
        fi;
#ifndef BROKEN_NOTE_ORDER
        /* notes_flush: (iv) the note, before any tombstone of the pass */
        if
        :: st == 2 ->
            d_step { if :: cexp < lm_ms -> lm_ms = cexp :: else fi; nt_on[me - 1] = 0; nt_r[me - 1] = 0; printf("MSC: claimer %d: (iv) note %d: lease_min [%d:%d]\n", me, cexp, lm_sw, lm_ms);
                     CHECK }
        :: else
        fi;
#endif
#endif
        /* (v) rl_index_tomb: under the owner's hazard, if the generation is still g, CAS each
         * noted entry to a tombstone */
        if
        :: tmask != 0 ->
            d_step {
                if
                :: gen == g ->
                    for (ti : 0 .. NI - 1) {
                        if :: tmask & (1 << ti) -> IK(g % 2, ti) = IK(g % 2, ti) | TOMB :: else fi
                    }
                :: else
                fi;
                printf("MSC: claimer %d: (v) tombstones (mask %d) %d\n", me, tmask, gen == g);
                tmask = 0; ti = 0 }
        :: else
        fi;
        /* floors_raise (each step also forgets what the rest of the pass no longer needs) */
#ifndef BROKEN_GEN
        if
        :: d_step { gen != g ->                                 /* (c) moved: nothing */
                        printf("MSC: claimer %d: (c) generation moved: no raise\n", me);
                        g = 0; w_min = 0; w_ep = 0; pos = 0; rmin = 0; any = 0; found = 0; ZERO_GRANT_SCRATCH; PUSED_RESET }
        :: d_step { gen == g ->
#else
        if
        :: d_step { true ->                                     /* no (c) */
#endif
                        /* the proposal: the first live key (not held in flight), else the last
                         * key read; then the minimum with ring_min */
                        prop = (any -> (IK(g % 2, pos - 1) & ~TOMB) : NONE);
#ifndef BROKEN_PROPOSAL
                        prop = (prop != NONE && rmin < prop -> rmin : prop);
#endif
                        rmin = 0; any = 0; ZERO_GRANT_SCRATCH;
                /* the skip hint, forward only within a generation (a CAS loop; one step with
                 * (c): a merge in between only leaves a hint of a generation no later pass uses) */
                if
                :: skip_gen != g || skip_pos < pos - found -> skip_gen = g; skip_pos = pos - found;
#ifndef BROKEN_HINT
                                                              skip_min = w_min
#else
                                                              skip
#endif
                :: else
                fi;
                if
                :: prop == NONE || prop <= w_min -> prop = 0; w_min = 0; w_ep = 0   /* no raise */
                :: else
                fi;
                g = 0; pos = 0; found = 0; PUSED_RESET };
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
                           me, w_min, w_ep, prop, w_ep, fmin, fep);
                    CHECK;
                    prop = 0; w_min = 0; w_ep = 0 }
            :: else
            fi
        fi;
#if GRANTS
        /* The holder of the lease (the worker that called rl_claim) ends it: complete (or
         * fail), release, or neither (it lapses at its expiry). */
        if
        :: st == 2 ->
            /* lease_begin_write: the token -> "writing" (a lost lease changes nothing), and a
             * row removed meanwhile gives it back (the CAS and that load of the key in one
             * step: a removal ends the lease too, so one between them ends as one before) */
            d_step {
                if
                :: lown[cr] == me && lexp[cr] == cexp && key[cr] != NONE -> lexp[cr] = HZ; hw = 1
                :: else -> hw = 0
                fi;
                printf("MSC: claimer %d: lease end of row %d: writing %d\n", me, cr, hw);
                CHECK;
                if :: !hw -> RESET_PASS :: else fi };
            if
            :: hw ->
                if
                :: ENDS & 2 ->
#ifndef BROKEN_RELEASE
                    /* rl_release: the row goes back at its key */
#if defined(WRITER_KEEPS_FLIGHT) || defined(RELEASE_PUBLISH_FIRST)
                    d_step { wk = key[cr]; hw = flight[cr]; printf("MSC: claimer %d: release: word (%d, FLIGHT %d)\n", me, wk, hw) };
#else
                    /* the word's load and rl_flight_return's CAS in one step: what changes the
                     * word between them (a store, a put-back) clears FLIGHT, so the CAS fails
                     * exactly when a later load would have found no FLIGHT */
                    d_step { wk = key[cr]; hw = flight[cr] && wk != NONE;
                             if :: hw -> flight[cr] = 0; hp_on[me - 1] = 1; hp_r[me - 1] = cr; hp_k[me - 1] = wk :: else fi;
                             printf("MSC: claimer %d: release: word (%d, FLIGHT %d): cleared %d\n", me, wk, flight[cr] || hw, hw); CHECK };
#endif
                    if
                    :: hw && wk != NONE ->
#ifndef RELEASE_PUBLISH_FIRST
#ifdef WRITER_KEEPS_FLIGHT
                        /* rl_flight_return: CAS-clear FLIGHT (if the word is unchanged), then
                         * publish the key */
                        d_step {
                            if
                            :: key[cr] == wk && flight[cr] -> flight[cr] = 0; hp_on[me - 1] = 1; hp_r[me - 1] = cr; hp_k[me - 1] = wk
                            :: else -> hw = 0
                            fi;
                            printf("MSC: claimer %d: release: clear FLIGHT of row %d: %d\n", me, cr, hw); CHECK };
#endif
                        if :: hw -> republish(cr, wk, p) :: else fi
#else
                        /* as the protocol was first written: publish, then clear FLIGHT */
                        ring_append(wk, cr, p);
                        d_step { RMIN_NOTE(wk); printf("MSC: claimer %d: ring_min note %d: ring_min = %d\n", me, wk, ring_min) };
                        d_step { FLOOR_LOWER(wk); printf("MSC: claimer %d: floor lowered to [%d:%d]\n", me, fmin, fep); CHECK };
                        d_step { if :: key[cr] == wk && flight[cr] -> flight[cr] = 0 :: else fi; printf("MSC: claimer %d: release: FLIGHT of row %d cleared\n", me, cr);
                                 CHECK }
#endif
                    :: else
                    fi;
                    /* lease_end_write */
                    d_step { if :: lown[cr] == me && lexp[cr] == HZ -> lown[cr] = 0; lexp[cr] = 0 :: else fi; printf("MSC: claimer %d: release: lease of row %d free\n", me, cr);
                             CHECK};
                    d_step { END_RECHECK(cr); CHECK; RESET_PASS }
#else
                    /* broken: rl_release frees the lease and puts nothing back */
                    d_step { if :: lown[cr] == me && lexp[cr] == HZ -> lown[cr] = 0; lexp[cr] = 0 :: else fi; printf("MSC: claimer %d: release: BROKEN: lease of row %d free, FLIGHT left\n", me, cr);
                             CHECK; RESET_PASS }
#endif
                :: ENDS & 1 ->
                    /* rl_complete_many / rl_fail: a new row word (no FLIGHT), published */
                    select (m : 0 .. NM - 1);
                    skip;
                    d_step { key[cr] = m; flight[cr] = 0; hp_on[me - 1] = 1; hp_r[me - 1] = cr; hp_k[me - 1] = m; printf("MSC: claimer %d: complete: key[%d] = %d\n", me, cr, m);
                             CHECK };
                    ring_append(m, cr, p);
                    d_step { RMIN_NOTE(m); printf("MSC: claimer %d: ring_min note %d: ring_min = %d\n", me, m, ring_min) };
                    d_step { FLOOR_LOWER(m); hp_on[me - 1] = 0; hp_r[me - 1] = 0; hp_k[me - 1] = 0; printf("MSC: claimer %d: floor lowered to [%d:%d]\n", me, fmin, fep);
                             CHECK };
                    d_step { if :: lown[cr] == me && lexp[cr] == HZ -> lown[cr] = 0; lexp[cr] = 0 :: else fi; printf("MSC: claimer %d: complete: lease of row %d free\n", me, cr);
                             CHECK};
                    d_step { END_RECHECK(cr); CHECK; RESET_PASS }
                fi
            :: else
            fi
        :: d_step { st == 2 && (ENDS & 4) -> printf("MSC: claimer %d: the lease of row %d is left to lapse\n", me, cr); RESET_PASS }
        :: d_step { st != 2 -> RESET_PASS }
        fi
#endif
    }
}

#if NSW > 0
/* ------------------------------------------------------------------ sweeper ------------ */
/* rl_sweep_if_due, as run by some claim pass: if lease_min is not sweeping and its ms is due,
 * CAS it to [sweeping : HORIZON]; walk the rows (each: its word, and if FLIGHT its lease);
 * put back the FLIGHT rows whose lease is claimable (CAS-clear FLIGHT where the word is
 * unchanged, then publish them: append each, one ring_min note, one floor lower), and take
 * the least expiry of the others; then CAS lease_min to [0 : min(that, its ms)]. */
proctype sweeper() {
    byte n, snow, r, sk, p, mk;
    bit sf;
    for (n : 1 .. NSW) {
        if
        :: d_step { !lm_sw && lm_ms <= now ->
                        snow = now; lm_sw = 1; lm_ms = HZ; sw_pos = 0; sw_m = HZ; printf("MSC: sweeper: lease_min due at now %d: sweeping\n", snow);
                        CHECK };
            do
            :: sw_pos < NR ->
                d_step { sf = flight[sw_pos]; sk = key[sw_pos];
                         printf("MSC: sweeper: row %d: (%d, FLIGHT %d)\n", sw_pos, sk, sf);
                         if :: !sf -> sw_pos++; sk = 0; CHECK :: else fi };
                if
                :: sf ->
                    d_step {
                        if
                        :: CLAIMABLE(sw_pos, snow) -> if :: sk != NONE -> sw_sel[sw_pos] = 1; sw_wk[sw_pos] = sk :: else fi
                        :: else -> if :: lexp[sw_pos] < sw_m -> sw_m = lexp[sw_pos] :: else fi
                        fi;
                        printf("MSC: sweeper: row %d: lease [%d:%d]: put back %d\n", sw_pos, lown[sw_pos], lexp[sw_pos], sw_sel[sw_pos]);
                        sw_pos++; sf = 0; sk = 0; CHECK }
                :: else
                fi
            :: else -> break
            od;
            /* rl_flight_return */
#ifndef SWEEP_PUBLISH_FIRST
            for (r : 0 .. NR - 1) {
                if
                :: sw_sel[r] ->
                    d_step { if
                             :: key[r] == sw_wk[r] && flight[r] -> flight[r] = 0; sp_on[r] = 1; sp_k[r] = sw_wk[r]
                             :: else
                             fi;
                             printf("MSC: sweeper: clear FLIGHT of row %d: %d\n", r, sp_on[r]);
                             sw_sel[r] = 0; sw_wk[r] = 0; CHECK }
                :: else
                fi
            };
            mk = NONE;
            for (r : 0 .. NR - 1) {
                if
                :: sp_on[r] -> ring_append(sp_k[r], r, p); if :: sp_k[r] < mk -> mk = sp_k[r] :: else fi
                :: else
                fi
            };
            if
            :: mk != NONE ->
                d_step { RMIN_NOTE(mk); printf("MSC: sweeper: ring_min note %d: ring_min = %d\n", mk, ring_min) };
                d_step {
#ifndef BROKEN_REPUBLISH
                    FLOOR_LOWER(mk);
#endif
                    for (ti : 0 .. NR - 1) { sp_on[ti] = 0; sp_k[ti] = 0 }; ti = 0; printf("MSC: sweeper: floor lowered to [%d:%d]\n", fmin, fep);
                    CHECK }
            :: else
            fi;
#else
            /* as the protocol was first written: publish the keys read, then clear FLIGHT */
            mk = NONE;
            for (r : 0 .. NR - 1) {
                if
                :: sw_sel[r] -> ring_append(sw_wk[r], r, p); if :: sw_wk[r] < mk -> mk = sw_wk[r] :: else fi
                :: else
                fi
            };
            if
            :: mk != NONE ->
                d_step { RMIN_NOTE(mk); printf("MSC: sweeper: ring_min note %d: ring_min = %d\n", mk, ring_min) };
                d_step { FLOOR_LOWER(mk); printf("MSC: sweeper: floor lowered to [%d:%d]\n", fmin, fep); CHECK }
            :: else
            fi;
            for (r : 0 .. NR - 1) {
                if
                :: sw_sel[r] ->
                    d_step { if :: key[r] == sw_wk[r] && flight[r] -> flight[r] = 0 :: else fi;
                             printf("MSC: sweeper: clear FLIGHT of row %d: %d\n", r, !flight[r]);
                             sw_sel[r] = 0; sw_wk[r] = 0; CHECK }
                :: else
                fi
            };
#endif
            /* the end: fold the walk's least expiry into the notes made meanwhile */
            skip;
            d_step {
#ifndef BROKEN_SWEEP_MIN
                if :: sw_m < lm_ms -> lm_ms = sw_m :: else fi;
#else
                lm_ms = sw_m;   /* broken: the notes made during the sweep are lost */
#endif
                lm_sw = 0; printf("MSC: sweeper: done: lease_min [%d:%d]\n", lm_sw, lm_ms);
                CHECK;
                sw_pos = 0; sw_m = 0; snow = 0; mk = 0; r = 0 }
        :: skip
        fi
    }
}
#endif

#if NT > 1
/* ------------------------------------------------------------------ clock -------------- */
proctype clock() {
    byte t;
    for (t : 1 .. NT - 1) {
        d_step { now++; printf("MSC: clock: now = %d\n", now); CHECK }
    }
}
#endif

#if NC > 0
/* ------------------------------------------------------------------ compactor ---------- */
#define MERGED(a, i) (i < tm -> a[(i < NR -> i : 0)] : 15)
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
        /* the merge: the entries of generation g but its tombstones (kept unread when no
         * published slot of [head, upto) names their row and none there was abandoned, else
         * only if wanted: at that key, and not FLIGHT with a lease) and the wanted published
         * ring entries of [head, upto), without duplicates, sorted by (key, row), into buffer
         * (g + 1) % 2 */
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
                tx = IR(g % 2, ti);
                if
                :: IK(g % 2, ti) & TOMB -> skip                 /* a tombstone: dropped */
                :: else ->
                    if
                    :: (!tall && !tmoved[tx]) || (key[tx] == IK(g % 2, ti) && WANTED(tx)) ->
                        tk[tm] = IK(g % 2, ti); tr[tm] = tx; tm++
                    :: else
                    fi
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
                :: rs_state[ti] == PUB && rs_key[ti] != NONE && key[tx] == rs_key[ti] && WANTED(tx) ->
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
                :: ti < tm -> IK((g + 1) % 2, ti) = tk[ti]; IR((g + 1) % 2, ti) = tr[ti]
                :: else -> IK((g + 1) % 2, ti) = 0; IR((g + 1) % 2, ti) = 0
                fi;
                ti++
            :: else -> break
            od;
            icnt[(g + 1) % 2] = tm;
            printf("MSC: compactor: merged into buffer %d: %d entries, keys %d %d %d, rows %d %d %d (15: none)\n",
                   (g + 1) % 2, tm, MERGED(tk, 0), MERGED(tk, 1), MERGED(tk, 2),
                   MERGED(tr, 0), MERGED(tr, 1), MERGED(tr, 2));
            ti = 0; tj = 0; tm = 0; tx = 0; tall = 0;
            for (ti : 0 .. NR - 1) { tmoved[ti] = 0; tk[ti] = 0; tr[ti] = 0 };
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
 * queued), indexed as generation 0; no lease held, no FLIGHT; an empty ring; no floor;
 * lease_min [0 : HORIZON]. */
init {
    byte r, m;
#ifndef ANY_START
    for (r : 0 .. NR - 1) { key[r] = (r + 1) % NM };
#ifdef ADDS
    key[NR - 1] = NONE;         /* not yet added */
#endif
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
        for (ti : 0 .. NR - 1) { tk[ti] = 0; tr[ti] = 0 };
        ti = 0; tj = 0; tm = 0; r = 0; m = 0;
        printf("MSC: start: row keys %d %d %d (15: not queued, or no such row), floor [0:0]\n",
               SHOWN(key, 0), SHOWN(key, 1), SHOWN(key, 2));
        CHECK
    };
    atomic {
#if NW > 0
        run writer();
#endif
        run claimer(1);
#if NCL > 1
        run claimer(2);
#endif
#if NC > 0
        run compactor();
#endif
#if NSW > 0
        run sweeper();
#endif
#if NT > 1
        run clock();
#endif
        printf("MSC: processes: [pid] 1..: writer (if any), claimers, compactor, sweeper, clock\n")
    };
    /* When every process has ended, for every queued row: held in flight (FLIGHT, its lease
     * not claimable), and then covered (the property); or FLIGHT with a claimable lease, and
     * then a sweep is due (not sweeping, ms <= now): that final sweep puts it back; or not
     * FLIGHT, and then findable at its key, in the index of the current generation (not a
     * tombstone, not before this generation's skip hint) or in a published slot of the ring
     * that is left, and not below the floor (DESIGN: recent writes visible to claims at once;
     * a merge never loses a live row). */
    (_nr_pr == 1);
    d_step {
        for (ti : 0 .. NR - 1) {
            if
            :: key[ti] != NONE && flight[ti] && !CLAIMABLE(ti, now) -> skip
            :: key[ti] != NONE && flight[ti] && CLAIMABLE(ti, now) && !lm_sw && lm_ms <= now -> skip
            :: key[ti] != NONE && !(flight[ti] && !CLAIMABLE(ti, now)) && (lm_sw || lm_ms > now || !flight[ti]) ->
                tm = 0;
                for (tj : 0 .. NI - 1) {
                    if
                    :: tj < icnt[gen % 2] && IR(gen % 2, tj) == ti && IK(gen % 2, tj) == key[ti] &&
                       (skip_gen != gen || tj >= skip_pos
#ifndef BROKEN_HINT
                        || fmin < skip_min
#endif
                       ) -> tm = 1
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
                if
                :: tm == 0 && flight[ti] ->
                    printf("MSC: end: row %d (key %d) is FLIGHT with a claimable lease, no sweep is due (lease_min [%d:%d], now %d), and it is in neither the index nor the ring\n",
                           ti, key[ti], lm_sw, lm_ms, now)
                :: tm == 0 && !flight[ti] ->
                    printf("MSC: end: row %d (key %d) is in neither the index (at or after a skip hint a pass at the floor would use: [%d:%d]) nor the ring\n",
                           ti, key[ti], skip_gen, skip_pos)
                :: else
                fi;
                assert(tm == 1);
                if :: fmin != 0 && key[ti] < fmin -> printf("MSC: end: row %d (key %d) is below the floor %d\n", ti, key[ti], fmin) :: else fi;
                assert(fmin == 0 || key[ti] >= fmin)
            :: else
            fi
        }
    }
}
