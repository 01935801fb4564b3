"""The one proposer protocol: every CPU drafter proposes a token tree (a chain: one child each), says through
its flags what the scheduler must hand it, and plans the depths of the nodes it may propose."""

from __future__ import annotations

import pytest
from batch_helpers import make_engine

from specpipe.runtime.cpu.drafters.drafters import NgramDrafter
from specpipe.runtime.cpu.drafters.tree_drafter import spread_depths
from specpipe.runtime.cpu.verify.accept import chain_tree
from specpipe.runtime.cpu.verify.tree_accept import DraftTree

pytestmark = pytest.mark.usefixtures("single_thread")


def test_a_chain_drafter_proposes_its_chain_as_a_one_child_tree():
    drafter = NgramDrafter(3)
    context = [1, 2, 3, 10, 11, 12, 13, 1, 2, 3]
    drafter.reset(context)
    tree = drafter.propose(context, 3, 3)
    assert (tree.tokens, tree.parents) == ([10, 11, 12], [-1, 0, 1]) and tree.is_chain()
    assert drafter.propose(context, 5, 2).tokens == [10, 11]  # no deeper than asked
    assert drafter.node_depths(4, [1, 1]) == [1, 2, 3, 4]


def test_is_chain_tells_a_chain_from_a_branching_tree():
    assert chain_tree([5, 6, 7]).is_chain() and DraftTree([], []).is_chain()
    assert not DraftTree([5, 6, 7], [-1, -1, 0]).is_chain()
    assert DraftTree([5, 6, 7], [-1, -1, 0]).first_children() == chain_tree([5, 7])


def test_tree_drafters_plan_their_static_tree_or_spread_a_dynamic_one():
    assert make_engine("medusa").drafter.node_depths(7, None) == [1, 1, 1, 2, 2, 2, 3]
    assert make_engine("eagle").drafter.node_depths(7, [1]) == [1, 1, 1, 2, 2, 2, 3]  # static: latest unused
    assert make_engine("eagle-dynamic").drafter.node_depths(8, None) == spread_depths(8, 3, None)
    assert spread_depths(8, 3, None) == [1, 1, 2, 2, 3, 3, 3, 3]
    assert spread_depths(8, 3, [1, 1, 1, 2]) == [1, 1, 1, 2, 3, 3, 3, 3]
    assert spread_depths(6, 3, [1, 2, 2]) == [1, 2, 2, 2, 3, 3]  # never shallower than the latest's deepest


def test_fork_gives_a_draft_model_its_own_cache_and_keeps_the_weights():
    template = make_engine("draft-model").drafter
    first, second = template.fork(), template.fork()
    assert first.lm is not second.lm and first.lm.model is second.lm.model is template.lm.model
    assert first.draft_models() == [template.lm.model] and make_engine("ngram").drafter.draft_models() == []
