"""Every per-method table covers the methods that claim it, and a method missing from one is an error
naming the method and the table, never a fall into another method's branch.

A table is listed in :data:`TABLES` with the methods the registry says must have an entry; the checklist
"Adding a speculative method" in ``docs/architecture.md`` names every one of them.
"""

import pytest
from batch_helpers import make_engine
from repo_root import ROOT

from specpipe import build_cpu, build_cpu_settings, heads_format
from specpipe.bench import tune
from specpipe.build_request import BuildRequest
from specpipe.errors import MethodTableError
from specpipe.models import heads
from specpipe.presets import load_draft, load_target
from specpipe.runtime.cpu import loader
from specpipe.speculative import METHODS, Method, Runtime, SpeculativeSettings, entry_for
from specpipe.training import config, tasks
from specpipe.tree import Tree, TreeError
from specpipe.triton import deployment
from specpipe.trtllm import draft_settings, llmapi_schema, memory, plan, tool_argv
from specpipe.trtllm.build import plan_build
from specpipe.trtllm.quant import SCHEMES
from specpipe.trtllm.release import TRTLLM_VERSION
from specpipe.vllm import settings as vllm_settings
from specpipe.vllm.plan import make_plan as make_vllm_plan

ARCHITECTURE_DOC = ROOT / "docs" / "architecture.md"


def claiming(
    *runtimes: Runtime,
    weights: tuple = (None, "heads", "model"),
    tree: bool | None = None,
    trainable: bool | None = None,
    drafting: bool = False,
) -> frozenset[Method]:
    """The methods that run on any of ``runtimes`` and have the given kind of weights, shape and training."""
    return frozenset(
        m
        for m, s in METHODS.items()
        if any(s.runs_on(r) for r in runtimes)
        and s.weights in weights
        and (tree is None or s.has_tree == tree)
        and (trainable is None or s.trainable == trainable)
        and not (drafting and m is Method.NONE)
    )


GPU = (Runtime.TRTLLM, Runtime.TRTLLM_LLMAPI)
TRAINABLE = frozenset(m for m, s in METHODS.items() if s.trainable)
#: (name as the docs and the errors spell it, the table, the methods that must have an entry).
TABLES = [
    ("trtllm.draft_settings.RESOLVERS", lambda: draft_settings.RESOLVERS, claiming(*GPU)),
    ("trtllm.draft_settings.DESCRIPTIONS", lambda: draft_settings.DESCRIPTIONS, claiming(*GPU, drafting=True)),
    ("trtllm.memory.DRAFT_TERMS", lambda: memory.DRAFT_TERMS, claiming(*GPU, Runtime.VLLM)),
    ("trtllm.tool_argv.CONVERTERS", lambda: tool_argv.CONVERTERS, claiming(Runtime.TRTLLM)),
    ("trtllm.plan.WEIGHTS_WHAT", lambda: plan.WEIGHTS_WHAT, claiming(*GPU, weights=("heads", "model"))),
    (
        "trtllm.llmapi_schema.METHOD_KEYS",
        lambda: llmapi_schema.METHOD_KEYS,
        claiming(Runtime.TRTLLM_LLMAPI, drafting=True),
    ),
    (
        "trtllm.llmapi_schema.SPELLINGS (pinned release)",
        lambda: llmapi_schema.spelling_for(TRTLLM_VERSION).decoding_types,
        claiming(Runtime.TRTLLM_LLMAPI, drafting=True),
    ),
    (
        "vllm.settings.CONFIG_KEYS",
        lambda: vllm_settings.CONFIG_KEYS,
        frozenset(m for m in claiming(Runtime.VLLM, drafting=True) if METHODS[m].vllm_method),
    ),
    ("triton.deployment.TREE_DEPTH_LIMITS", lambda: deployment.TREE_DEPTH_LIMITS, claiming(*GPU, tree=True)),
    ("runtime.cpu.loader.DRAFTERS", lambda: loader.DRAFTERS, claiming(Runtime.CPU)),
    ("bench.tune.TREE_DEPTH_LIMITS", lambda: tune.TREE_DEPTH_LIMITS, claiming(Runtime.CPU, tree=True)),
    ("build_cpu_settings.TREE_LEVELS", lambda: build_cpu_settings.TREE_LEVELS, claiming(Runtime.CPU, tree=True)),
    ("build_cpu.HEAD_COUNTS", lambda: build_cpu.HEAD_COUNTS, claiming(Runtime.CPU, weights=("heads",))),
    ("heads_format.CONVERTER_LAYOUTS", lambda: heads_format.CONVERTER_LAYOUTS, claiming(*Runtime, weights=("heads",))),
    ("heads_format.COMPACT_FILES", lambda: {Method(k): v for k, v in heads_format.COMPACT_FILES.items()}, TRAINABLE),
    ("models.heads.SHIPPED_FOLDERS", lambda: heads.SHIPPED_FOLDERS, TRAINABLE),
    ("training.config.TRAINING_DEFAULTS", lambda: config.TRAINING_DEFAULTS, TRAINABLE),
    ("training.tasks.TASKS", lambda: tasks.TASKS, TRAINABLE),
]


def missing_entries(table, required: frozenset[Method]) -> list[str]:
    return sorted(m.value for m in required - set(table))


@pytest.mark.parametrize("name, table, required", TABLES, ids=[t[0] for t in TABLES])
def test_every_method_that_claims_a_table_has_an_entry(name, table, required):
    assert required, f"{name}: no method claims it; drop it from TABLES or fix the predicate"
    lacking = missing_entries(table(), required)
    assert not lacking, (
        f"{name} has no entry for {lacking}: add one (docs/architecture.md, 'Adding a speculative method')"
    )
    assert all(isinstance(key, Method) for key in table()), f"{name} is keyed by something else than Method"


@pytest.mark.parametrize("name", [t[0] for t in TABLES])
def test_the_checklist_names_every_table(name):
    assert f"`{name.split(' ')[0]}`" in ARCHITECTURE_DOC.read_text(), f"docs/architecture.md does not name {name}"


def test_a_table_without_a_method_fails_the_coverage_check():
    """The check above is not vacuous: a table missing one claimed method is reported with its name."""
    without_medusa = {m: v for m, v in memory.DRAFT_TERMS.items() if m is not Method.MEDUSA}
    assert missing_entries(without_medusa, claiming(*GPU, Runtime.VLLM)) == ["medusa"]


def test_entry_for_names_the_method_and_the_table():
    with pytest.raises(
        MethodTableError,
        match=r"method 'medusa' has no entry in some.TABLE: add one .*"
        r"it has entries for eagle",
    ):
        entry_for({Method.EAGLE: 1}, "medusa", "some.TABLE")
    assert entry_for({Method.EAGLE: 1}, "eagle", "some.TABLE") == 1


def _plan(tmp_path, **request):
    return plan_build(
        BuildRequest(
            target="llama3-70b", dry_run=True, engines_dir=tmp_path, executor="docker", gpu="h100-80gb", **request
        ),
        importable=lambda: False,
    )


def test_memory_plan_of_a_method_missing_from_its_table_is_an_error(monkeypatch):
    common = dict(
        target=load_target("llama3-70b").architecture,
        scheme=SCHEMES["bf16"],
        tp=1,
        pp=1,
        batch=8,
        max_seq_len=8192,
        max_draft_len=4,
    )
    before = memory.plan_memory(method="medusa", medusa=(4, 1), **common)
    assert before.draft_weights > 0  # Medusa's heads are counted
    monkeypatch.delitem(memory.DRAFT_TERMS, Method.MEDUSA)
    with pytest.raises(MethodTableError, match="'medusa' has no entry in trtllm.memory.DRAFT_TERMS"):
        memory.plan_memory(method="medusa", medusa=(4, 1), **common)


@pytest.mark.parametrize(
    "table, method, request_fields",
    [
        (draft_settings.RESOLVERS, Method.EAGLE, {"draft": "eagle", "runtime": "trtllm"}),
        (draft_settings.DESCRIPTIONS, Method.LOOKAHEAD, {"draft": "lookahead", "runtime": "trtllm"}),
        (tool_argv.CONVERTERS, Method.LOOKAHEAD, {"draft": "lookahead", "runtime": "trtllm"}),
        (plan.WEIGHTS_WHAT, Method.DRAFT_MODEL, {"draft": "llama3.2-1b", "runtime": "trtllm", "quantization": "fp8"}),
        (llmapi_schema.METHOD_KEYS, Method.NGRAM, {"draft": "ngram", "runtime": "trtllm-llmapi"}),
    ],
    ids=lambda v: v.value if isinstance(v, Method) else None,
)
def test_a_plan_for_a_method_missing_from_a_table_is_an_error(table, method, request_fields, tmp_path, monkeypatch):
    _plan(tmp_path / "before", **request_fields)  # plans with the entry
    monkeypatch.delitem(table, method)
    with pytest.raises(MethodTableError, match=f"'{method.value}' has no entry in trtllm\\."):
        _plan(tmp_path / "after", **request_fields)


def test_cpu_tree_settings_and_training_defaults_refuse_a_missing_method(monkeypatch):
    assert build_cpu_settings.resolve_speculative(load_draft("eagle"), None, None).num_eagle_layers >= 1
    monkeypatch.delitem(build_cpu_settings.TREE_LEVELS, Method.EAGLE)
    with pytest.raises(MethodTableError, match="'eagle' has no entry in build_cpu_settings.TREE_LEVELS"):
        build_cpu_settings.resolve_speculative(load_draft("eagle"), None, None)
    assert config.TrainConfig.defaults_for("draft-model").window == 128
    monkeypatch.delitem(config.TRAINING_DEFAULTS, Method.DRAFT_MODEL)
    with pytest.raises(MethodTableError, match="'draft-model' has no entry in training.config.TRAINING_DEFAULTS"):
        config.TrainConfig.defaults_for("draft-model")
    monkeypatch.delitem(heads.SHIPPED_FOLDERS, Method.MEDUSA)
    with pytest.raises(MethodTableError, match="'medusa' has no entry in models.heads.SHIPPED_FOLDERS"):
        heads.shipped_dir("smollm2-135m", "medusa")


def test_tune_and_vllm_refuse_a_method_missing_from_their_tables(monkeypatch, tmp_path):
    medusa = build_cpu_settings.resolve_speculative(load_draft("medusa"), None, None).with_(num_medusa_heads=2)
    assert max(c.tree.depth for c in tune.candidates_for(medusa, (1, 2, 3, 4))) <= 2  # chains stop at the heads
    monkeypatch.delitem(tune.TREE_DEPTH_LIMITS, Method.MEDUSA)
    with pytest.raises(MethodTableError, match="'medusa' has no entry in bench.tune.TREE_DEPTH_LIMITS"):
        tune.candidates_for(medusa, (1, 2))
    request = BuildRequest(
        target="llama3.1-8b", draft="llama3.2-1b", runtime="vllm", dry_run=True, engines_dir=tmp_path, gpu="h100-80gb"
    )
    assert make_vllm_plan(request).speculative_config["draft_tensor_parallel_size"] == 1
    monkeypatch.delitem(vllm_settings.CONFIG_KEYS, Method.DRAFT_MODEL)
    with pytest.raises(MethodTableError, match="'draft-model' has no entry in vllm.settings.CONFIG_KEYS"):
        make_vllm_plan(request)


def test_packaging_checks_a_tree_only_against_its_own_method_s_limit(monkeypatch):
    eagle = SpeculativeSettings(
        Method.EAGLE, max_draft_len=3, tree=Tree.parse([[0], [0, 0], [0, 0, 0]]), num_eagle_layers=2
    )
    with pytest.raises(TreeError, match="EAGLE layers"):
        deployment.check_speculative(eagle, "engine e")
    monkeypatch.delitem(deployment.TREE_DEPTH_LIMITS, Method.EAGLE)
    with pytest.raises(MethodTableError, match="'eagle' has no entry in triton.deployment.TREE_DEPTH_LIMITS"):
        deployment.check_speculative(eagle.with_(num_eagle_layers=3), "engine e")


def test_the_pinned_llmapi_spelling_is_the_registry():
    settings = SpeculativeSettings(Method.NGRAM, max_draft_len=3, max_matching_ngram_size=2)
    assert (
        llmapi_schema.build_speculative_config(settings, None)["decoding_type"] == METHODS[Method.NGRAM].decoding_type
    )
    assert llmapi_schema.spelling_for(TRTLLM_VERSION).decoding_types is llmapi_schema.PINNED_DECODING_TYPES


@pytest.mark.parametrize("method", list(loader.DRAFTERS), ids=lambda m: m.value)
def test_the_cpu_drafters_flags_are_the_registry_s(method):
    """The scheduler reads a drafter's protocol flags, never its class: they agree with the method's record
    (a tree method's proposals branch, heads read the target's features, a draft model brings its own LM)."""
    spec, drafter = METHODS[method], make_engine(method.value).drafter
    assert (drafter.trees, drafter.reads_features) == (spec.has_tree, spec.weights == "heads")
    assert bool(drafter.draft_models()) == (spec.weights == "model")
