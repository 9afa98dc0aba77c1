"""A challenger beside the champion: a second version of the model run on a share of the same requests, off the
request path, judged with its own bundle and compared with the champion (``challenger:`` settings). It is one
companion of the serving agent (:class:`agent.judging.companions.Companion`).

The recorder hands every judged request to the challenger first (:meth:`Challenger.take_judged`, in any mode:
the champion's predictions come from the agent's model, the upstream or the observations, with the request's
inputs). A request is paired or not as a whole, by a keyed hash of its id (``challenger.share``; the key is the
process's own, so no client chooses what is compared); a paired one waits in a bounded queue
(``challenger.queue_limit``; beyond it the request is dropped and counted) for the challenger's thread (a
:class:`~agent.judging.linger.LingerLoop`, as the judge queue's), which

1. runs the challenger's model on the requests' inputs (several requests in one call) and judges its
   predictions with the challenger's oracle (:mod:`.pairing`);
2. adds, per time window (:class:`~agent.judging.paired_windows.PairedWindows`), the champion's statistics of
   the paired predictions, the challenger's (both built as the recorder builds its own:
   :func:`~agent.judging.recorder.judged_stats`) and the pair's sums (:mod:`agent.estimation.pairs.paired`: its
   disagreements, their ``q_A``, ``q_B`` from the pair's calibration in the challenger's bundle);
3. with delayed labels, hands the champion's request on to the labeling sample, preferring its disagreements
   (:mod:`agent.labels.paired_labels`); unpaired requests go to the sample at once.

The champion's answer never waits for any of it: the hand-over only draws the hash and enqueues. The thread's
CPU time, the model's time and the queue are the challenger's own metrics (:mod:`exporters.challenger_metrics`).
A reload to another champion model restarts the paired windows; one the pair was not calibrated for is not
paired (``dropped{reason="other_champion"}``).

Modules: :mod:`.loading` (the challenger's runtime and pair, and the companion built from the settings),
:mod:`.pairing` (the challenger's predictions and the paired statistics of a group of requests),
:mod:`.companion` (the queue, the thread, the windows and what is reported).
"""

from agent.dataplane.challenger.companion import Challenger, Forward
from agent.dataplane.challenger.loading import challengers_of, load_challenger

__all__ = ["Challenger", "Forward", "challengers_of", "load_challenger"]
