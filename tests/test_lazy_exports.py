import importlib
import sys

import pytest

import hybridflow.distributed
import hybridflow.rollout
import hybridflow.workers


@pytest.fixture()
def lazy_package(tmp_path, monkeypatch):
    """A package ``lazy_pkg`` whose ``Thing`` lives in ``lazy_pkg.heavy``, exported lazily."""
    package = tmp_path / "lazy_pkg"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from hybridflow.lazy_exports import lazy_exports\n"
        "__getattr__, __dir__, __all__ = lazy_exports(__name__, {'heavy': ['Thing']})\n"
    )
    (package / "heavy.py").write_text("class Thing:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield importlib.import_module("lazy_pkg")
    for name in ("lazy_pkg", "lazy_pkg.heavy"):
        sys.modules.pop(name, None)


def test_a_name_loads_its_module_when_first_read(lazy_package):
    assert "lazy_pkg.heavy" not in sys.modules
    assert lazy_package.__all__ == ["Thing"] and "Thing" in dir(lazy_package)
    from lazy_pkg import Thing

    assert Thing is sys.modules["lazy_pkg.heavy"].Thing
    with pytest.raises(AttributeError, match="module 'lazy_pkg' has no attribute 'Missing'"):
        lazy_package.Missing  # noqa: B018


@pytest.mark.parametrize(
    "package", [hybridflow.distributed, hybridflow.rollout, hybridflow.workers], ids=lambda package: package.__name__
)
def test_every_public_name_of_the_lazy_packages_resolves(package):
    for name in package.__all__:
        getattr(package, name)  # raises AttributeError if the name is mapped to the wrong module
