"""The CPU runtime and ``train-draft`` cover the registry: every method that claims the CPU runtime has a
drafter factory, every trainable method a trainer, and neither table holds a method the registry does not
give them."""

from specpipe.runtime.cpu.loader import DRAFTERS
from specpipe.speculative import METHODS, Runtime, methods_for
from specpipe.training.config import TRAINABLE
from specpipe.training.tasks import TASKS


def test_every_cpu_method_has_a_drafter_factory():
    cpu = set(methods_for(Runtime.CPU))
    assert cpu, "no method claims the CPU runtime"
    missing = cpu - set(DRAFTERS)
    assert not missing, f"methods claiming Runtime.CPU without a drafter factory in loader.DRAFTERS: {missing}"
    extra = set(DRAFTERS) - cpu
    assert not extra, f"loader.DRAFTERS has factories for methods that do not claim Runtime.CPU: {extra}"


def test_every_trainable_method_has_a_trainer():
    trainable = {m for m, spec in METHODS.items() if spec.trainable}
    assert trainable, "no method is trainable"
    assert trainable == set(TASKS), f"trainable {trainable} vs trainers {set(TASKS)}"
    assert set(TRAINABLE) == {m.value for m in trainable}


def test_head_methods_are_tree_drafters_on_cpu():
    from specpipe.runtime.cpu.drafters.eagle import load_eagle_drafter
    from specpipe.runtime.cpu.drafters.medusa import load_medusa_drafter

    heads = {m for m, spec in METHODS.items() if spec.weights == "heads" and spec.runs_on(Runtime.CPU)}
    assert heads and all(METHODS[m].has_tree for m in heads)
    assert callable(load_eagle_drafter) and callable(load_medusa_drafter)
