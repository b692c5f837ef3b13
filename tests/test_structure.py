"""The package's tiers, read from its import statements (tools/structure_metrics.py).

docs/architecture.md says who may import what; these tests hold the source to it.
"""

import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def metrics():
    path = os.path.join(ROOT, "tools", "structure_metrics.py")
    spec = importlib.util.spec_from_file_location("structure_metrics", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.measure(os.path.join(ROOT, "mxprof"))


def test_only_the_native_tier_imports_the_compiled_core(metrics):
    assert metrics["lib_users"] == []
    assert metrics["check_calls"] == []


def test_no_import_circles(metrics):
    assert metrics["circles"] == []


def test_the_live_objects_and_extensions_reach_no_private_name_of_another_package(metrics):
    mine = ("mxprof/cuda/", "mxprof/integrations/", "mxprof/distributed/")
    live = ("mxprof.ranges", "mxprof.domain", "mxprof._named", "mxprof.memory", "mxprof.scope")
    leaks = [
        p
        for p in metrics["cross_package_private"]
        if p.startswith(mine) or p.split(" ")[1].startswith(live)
    ]
    assert leaks == []
    # Within the extension packages too: what one module takes from another is public.
    assert [p for p in metrics["private"] if p.startswith(mine)] == []
    assert not [r for r in metrics["reached"] if "mxprof.domain" in r or "mxprof._named" in r]


def test_base_objects_import_no_device_code(metrics):
    # Task(..., stream=) finds mxprof.cuda through ranges.set_stream_task.
    assert not [lazy for lazy in metrics["lazy"] if lazy.startswith("mxprof/ranges.py")]
    with open(os.path.join(ROOT, "mxprof", "ranges.py"), encoding="utf-8") as f:
        assert "from .cuda" not in f.read()
