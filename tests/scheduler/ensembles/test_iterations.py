"""Iteration bookkeeping of decoupled ensembles (pure logic) and the decoupled derivation."""

from __future__ import annotations

from services.scheduler.ensembles.iterations import Scope, settle
from shared.config.ensemble_graph import Step, is_decoupled, max_inflight

PRE = Step(index=0, model="pre", version=-1, input_map={"X": "IN"}, output_map={"Y": "prompt"})
GEN = Step(index=1, model="gen", version=-1, input_map={"X": "prompt"}, output_map={"Y": "token"})
POST = Step(index=2, model="post", version=-1, input_map={"X": "token", "C": "context"}, output_map={"Y": "OUT"})
CTX = Step(index=3, model="ctx", version=-1, input_map={"X": "IN"}, output_map={"Y": "context"})
STEPS = [PRE, GEN, POST, CTX]


def _root() -> Scope[str]:
    return Scope(path=(), tensors={"IN": "in"})


def test_a_step_runs_once_in_the_scope_that_first_sees_all_its_inputs():
    root = _root()
    assert [s.model for s in root.ready_steps(STEPS)] == ["pre", "ctx"]
    root.launched.update({0, 3})
    root.tensors["prompt"] = "p"
    root.tensors["context"] = "c"
    assert [s.model for s in root.ready_steps(STEPS)] == ["gen"]
    root.launched.add(1)
    first, second = root.child(), root.child()
    assert (first.path, second.path) == ((0,), (1,))
    first.tensors["token"] = "t0"
    # the child owns one input (its token): post runs there; nothing upstream runs again
    assert [s.model for s in first.ready_steps(STEPS)] == ["post"]
    assert second.ready_steps(STEPS) == []  # no token yet
    assert first.visible() == {"IN": "in", "prompt": "p", "context": "c", "token": "t0"}


def test_a_late_upstream_tensor_reaches_live_iterations():
    root = _root()
    root.tensors["prompt"] = "p"
    child = root.child()
    child.tensors["token"] = "t0"
    assert child.ready_steps([POST]) == []  # context not there yet
    root.tensors["context"] = "c"
    assert child.ready_steps([POST]) == [POST]
    assert root.ready_steps([POST]) == []  # the root never has a token


def test_an_iteration_answers_once_with_at_least_one_output_of_its_own():
    root = _root()
    child = root.child()
    assert not child.due(["OUT"])
    child.tensors["OUT"] = "o"
    assert child.due(["OUT"])
    child.answered = True
    assert not child.due(["OUT"])
    # an output only upstream: the root answers it, its iterations do not repeat it
    root2 = _root()
    root2.tensors["OUT"] = "o"
    assert root2.due(["OUT"])
    assert not root2.child().due(["OUT"])


def test_iterations_settle_when_done_and_nothing_upstream_can_still_arrive():
    root = _root()
    root.running = 2  # the generator's stream and a preprocess
    root.producing = 1  # the preprocess writes into the root
    child = root.child()
    child.tensors["token"] = "t0"
    assert settle(root) == []  # the preprocess may still give this iteration an input
    root.producing = 0
    root.running = 1
    assert settle(root) == [child] and child.settled and root.children == []
    root.running = 0
    assert settle(root) == [root]


def test_a_parent_settles_in_the_same_pass_as_its_last_child():
    root = _root()
    child = root.child()
    grandchild = child.child()
    assert settle(root) == [grandchild, child, root]


def test_an_ensemble_with_a_decoupled_step_is_decoupled():
    configs = {
        "gen": {"name": "gen", "model_transaction_policy": {"decoupled": True}},
        "pre": {"name": "pre"},
        "plain": {"name": "plain", "platform": "ensemble", "ensemble_scheduling": {"step": [{"model_name": "pre"}]}},
        "llm": {
            "name": "llm",
            "platform": "ensemble",
            "ensemble_scheduling": {"step": [{"model_name": "pre"}, {"model_name": "gen"}], "max_inflight_requests": 2},
        },
        "outer": {"name": "outer", "platform": "ensemble", "ensemble_scheduling": {"step": [{"model_name": "llm"}]}},
        "loop": {"name": "loop", "platform": "ensemble", "ensemble_scheduling": {"step": [{"model_name": "loop"}]}},
    }
    assert [n for n in configs if is_decoupled(n, configs)] == ["gen", "llm", "outer"]
    assert not is_decoupled("missing", configs)
    assert (max_inflight(configs["llm"]), max_inflight(configs["plain"])) == (2, 0)
