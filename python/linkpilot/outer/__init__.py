"""Synchronizing across sites every H steps: inner steps stay inside a site, and every round the
sites exchange compressed pseudo-gradients (the change of the parameters since the last sync),
fragment by fragment, overlapped with the inner steps that follow, and apply them with an outer
optimizer (the DiLoCo family: DiLoCo, Streaming DiLoCo).

    sync = OuterSync(model, RoundPlan(sync_every=50, fragments=4, overlap=5, codec="int8"))
    for batch in data:
        inner_optimizer.zero_grad(); loss(model, batch).backward(); inner_optimizer.step()
        sync.step()

One rank per site (``sites`` None: every rank is a site) trains with a plain optimizer; with
several ranks per site, wrap the model in DDP over ``sync.site_group``: each rank of a site keeps
and exchanges a shard of the flat outer state (as many as the smallest site has ranks; where a
site has more, a shard's first holder exchanges and hands its results to the others) and
spreads what its outer steps write to the rest of the site in the same step
(``shard_state=False``: the site's first rank does it all).
Sites may differ in size (8 ranks in one, 16 in the other): each site's pseudo-gradient is the
average over its own ranks (DDP's), and the outer step takes the sites' mean weighted by the
samples each processed in the round (its steps in the round times ``samples_per_step``).

Sites may differ in speed: with ``pace="time"`` a round lasts H steps of the fastest site and
each site takes as many of its own as fit (``site_plan``), from the step times every header
carries, agreed with the plan; so no site idles waiting for another. Stop on ``rounds_done``.
``close()`` ends with every replica holding the same parameters (see there).

The schedule is counted in each site's own inner steps. A round of H steps sends fragment f
(of F contiguous parts of the flat parameters) at step (f + 1) * H / F of the round and applies
it ``overlap`` steps later: then every replica holds the same values for that fragment, the
outer optimizer's result from the same averaged pseudo-gradient. The exchange runs on a thread
of its own over a process group of the site leaders, built on a prefix of the job's store so
that it can be built again after a failure.

Agreement without a round trip: every message carries the sender's plan proposal (H, F,
overlap, codec; from ``plan_source``, e.g. the knob board), and round r + 1 runs the agreement
of the proposals carried by round r's first fragment exchange (the largest H, F and overlap, the
strongest codec; with one fragment a round, round r - 1's). Every site received the same
proposals in that exchange, so every site adopts the same plan for the same round, however late
it applies exchanges. A site whose copy has not landed when round r ends keeps stepping and
starts round r + 1 (its sends) when it lands: no step waits for it, the next round's sends do,
which also keeps the exchanges in flight to about one round.

Riding through an outage: an apply step waits for its exchange up to ``patience_s`` (default:
about one inner step's compute time, at least 0.1 s); one that has not landed by then is
applied at the first step after it lands (every site writes the same outer values, a few steps
apart), so a link that stalls for seconds costs no step; while one is out, later ones wait
behind it. An exchange that fails (its peer gone, the link dead past
``deadline_s``) is given up on; sites keep taking inner steps (sends are skipped while the
exchange is down) up to ``max_drift`` steps since their last sync, then wait. The exchange
thread builds its process group again (a new generation on the store, numbered by the first
site's leader once every leader said it is ready for it) and starts with a resync: the sites compare how many fragment updates each applied,
the one that applied most (the first of equals) sends its whole outer state, and every site
adopts it, sets its parameters to it, and starts a new round: all replicas are identical again.
"""

from __future__ import annotations

from linkpilot.outer.board import BoardPlan
from linkpilot.outer.plan import (
    PlanInputs,
    RoundPlan,
    RoundStats,
    agree_plans,
    auto_sync_every,
    paced_share,
    site_plan,
)
from linkpilot.outer.sync import OuterSync

__all__ = ["BoardPlan", "OuterSync", "PlanInputs", "RoundPlan", "RoundStats", "agree_plans",
           "auto_sync_every", "paced_share", "site_plan"]
