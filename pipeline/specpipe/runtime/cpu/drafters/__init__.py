"""Drafters: the cheap proposers of the tokens the target then verifies in one forward. The ``Drafter``
protocol and the chain drafters (n-gram, draft model; ``drafters``, ``reduced_draft`` with its reduced
draft vocabulary of ``draft_vocab``), and the tree drafters with the protocol the tree engine calls
(``tree_drafter``, ``tree_plan``): Medusa (``medusa``), EAGLE/EAGLE-2 (``eagle``, head in ``eagle_head``)
and EAGLE-3 (``eagle3``, head in ``eagle3_head``). Drafters run models from
:mod:`specpipe.runtime.cpu.model` and use the token choice and draft trees of
:mod:`specpipe.runtime.cpu.verify`; they never import the engines or the scheduler."""
