"""Deciding: the reducer's winner of every (signature, problem) in a results dataset, as every surface shows it.

records       the values: Winner, Confirmation, Verification, StageFailure, Decisions; round names, calling-mode order
loading       the rows a decision reads (latest successful per candidate; whole stage and verify sessions)
rule          decide_results / decide_folder: farm.tuner.judging.winner's rule over the main (or finalist) round, then
confirmations each problem's confirmation stage per calling mode,
verifications farm verify's checks (a fixed decision publishes the default),
model_checks  the model checks of farm apply (a withdrawn decision publishes the default),
incumbents    the current override file's decisions, given the benefit of the doubt
"""

from farm.store.deciding.incumbents import decided_keys, incumbent_file, incumbent_spec, job_record, load_incumbents
from farm.store.deciding.loading import knobs_of, load_confirmations, load_successes
from farm.model.records import CALL_ORDER
from farm.store.deciding.records import (CONFIRM, ROUND_NAMES, VERIFY, Confirmation, Decisions,
                                         StageFailure, Verification, Winner)
from farm.store.deciding.rule import decide_folder, decide_results

__all__ = ["CALL_ORDER", "CONFIRM", "ROUND_NAMES", "VERIFY", "Confirmation", "Decisions", "StageFailure",
           "Verification", "Winner", "decide_folder", "decide_results", "decided_keys", "incumbent_file", "incumbent_spec",
           "job_record", "knobs_of", "load_confirmations", "load_incumbents", "load_successes"]
