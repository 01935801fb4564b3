"""Drafters: the cheap proposers of the tokens the target then verifies in one forward. The one protocol the
scheduler calls, ``Proposer`` (``proposer``: a proposal is a token tree, a chain a one-child tree); the chain
drafters (n-gram, draft model; ``drafters``, ``reduced_draft`` with its reduced draft vocabulary of
``draft_vocab``), and the tree drafters over the target's features (``tree_drafter``, ``tree_plan``): Medusa
(``medusa``), EAGLE/EAGLE-2 (``eagle``, head in ``eagle_head``) and EAGLE-3 (``eagle3``, head in ``eagle3_head``).
Drafters run models from :mod:`specpipe.runtime.cpu.model` and use the token choice and draft trees of
:mod:`specpipe.runtime.cpu.verify`; they never import the engines or the scheduler."""
