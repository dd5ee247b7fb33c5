"""Shape: labelled views over base ranks, and the MeshTrait operations meshes delegate to."""

import itertools
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from regency.shape import DimensionNotFoundError, Extent, Point, Shape, Slice

pytestmark = pytest.mark.timeout(30)


def mesh(**sizes: int) -> Shape:
    return Shape.from_extent(Extent(list(sizes), list(sizes.values())))


# -- construction, properties, str forms --------------------------------------------------


def test_properties() -> None:
    s = Shape(["hosts", "gpus"], Slice.new_row_major([2, 3]))
    assert s.labels == ["hosts", "gpus"]
    assert s.ndslice == Slice(0, [2, 3], [3, 1])
    assert s.ndim == 2
    assert len(s) == 6
    assert s.extent == Extent(["hosts", "gpus"], [2, 3])
    assert s.sizes == {"hosts": 2, "gpus": 3}
    assert s.ranks() == [0, 1, 2, 3, 4, 5]
    assert s == mesh(hosts=2, gpus=3)


def test_str_and_repr() -> None:
    s = mesh(hosts=2, gpus=3)
    assert str(s) == "{hosts=2,gpus=3}"
    assert repr(s) == (
        'Shape { labels: ["hosts", "gpus"], '
        "slice: Slice { offset: 0, sizes: [2, 3], strides: [3, 1] } }"
    )
    assert str(Shape.unity()) == "{}"


def test_unity() -> None:
    u = Shape.unity()
    assert (u.ndim, len(u), u.ranks(), u.labels) == (0, 1, [0], [])
    assert u.extent == Extent([], [])


def test_constructor_validation() -> None:
    with pytest.raises(ValueError, match="mismatch"):
        Shape(["a"], Slice.new_row_major([2, 3]))
    with pytest.raises(ValueError, match="unique"):
        Shape(["a", "a"], Slice.new_row_major([2, 3]))
    with pytest.raises(TypeError, match="Slice"):
        Shape(["a"], [0, 1])  # type: ignore[arg-type]


def test_equality_hash_pickle_immutability() -> None:
    s = mesh(hosts=2, gpus=3).slice(gpus=slice(1, 3))
    assert s == Shape(["hosts", "gpus"], Slice(1, [2, 2], [3, 1]))
    assert s != Shape(["h", "gpus"], Slice(1, [2, 2], [3, 1]))
    assert s != mesh(hosts=2, gpus=2)
    assert len({s, pickle.loads(pickle.dumps(s))}) == 1
    with pytest.raises(AttributeError):
        s.labels = ["x"]  # type: ignore[misc]


def test_coordinates_rank_of_and_points() -> None:
    s = mesh(hosts=4, gpus=3).slice(hosts=slice(0, 4, 2), gpus=slice(1, 3))
    assert s.ranks() == [1, 2, 7, 8]
    assert s.coordinates(7) == {"hosts": 1, "gpus": 0}
    assert [s.rank_of(r) for r in (1, 2, 7, 8)] == [0, 1, 2, 3]
    assert s.point_of_base_rank(8) == Point(3, Extent(["hosts", "gpus"], [2, 2]))
    for absent in (0, 4, 9):
        with pytest.raises(ValueError):
            s.rank_of(absent)
        with pytest.raises(ValueError):
            s.coordinates(absent)


# -- at / select / index (Monarch's Shape API) ------------------------------------------


def test_the_4x3_example() -> None:
    s = mesh(hosts=4, gpus=3)
    rows = s.select("hosts", slice(0, 2)).select("gpus", slice(1, 3))
    assert rows.ndslice == Slice(1, [2, 2], [3, 1])
    assert rows.ranks() == [1, 2, 4, 5]
    every_other = s.select("hosts", slice(0, 4, 2)).select("gpus", slice(1, None))
    assert every_other.ndslice == Slice(1, [2, 2], [6, 1])
    assert every_other.ranks() == [1, 2, 7, 8]


def test_at_removes_the_dimension() -> None:
    s = mesh(hosts=4, gpus=3)
    row = s.at("hosts", 2)
    assert row.labels == ["gpus"]
    assert row.ndslice == Slice(6, [3], [1])
    assert row.ranks() == [6, 7, 8]
    assert s.at("gpus", 1).ranks() == [1, 4, 7, 10]
    assert s.index(hosts=1, gpus=2).ranks() == [5]
    assert s.index() == s


def test_at_errors() -> None:
    s = mesh(hosts=2, gpus=3)
    with pytest.raises(ValueError, match="'cpus'"):
        s.at("cpus", 0)
    with pytest.raises(ValueError, match="out of range"):
        s.at("gpus", 3)
    with pytest.raises(OverflowError):
        s.at("gpus", -1)
    with pytest.raises(ValueError):
        s.index(gpus=5)


def test_select_keeps_the_dimension() -> None:
    s = mesh(hosts=2, gpus=8)
    assert s.select("gpus", slice(3, 5)).ranks() == [3, 4, 11, 12]
    assert s.select("gpus", slice(-2, None)).ranks() == [6, 7, 14, 15]
    picked = s.select("gpus", slice(1, 8, 3))
    assert picked.sizes == {"hosts": 2, "gpus": 3}
    assert picked.ranks() == [1, 4, 7, 9, 12, 15]
    # Composable on the same dimension.
    assert picked.select("gpus", slice(1, 3)).ranks() == [4, 7, 12, 15]
    assert s.select("gpus", range(2, 4)).ranks() == [2, 3, 10, 11]


def test_select_errors() -> None:
    s = mesh(hosts=2, gpus=8)
    with pytest.raises(ValueError, match="'cpus'"):
        s.select("cpus", slice(0, 1))
    with pytest.raises(ValueError, match="empty range"):
        s.select("gpus", slice(3, 3))
    with pytest.raises(ValueError, match="out of range"):
        s.select("gpus", slice(9, 12))
    with pytest.raises(ValueError, match="step"):
        s.select("gpus", slice(None, None, -1))
    with pytest.raises(ValueError, match="step"):
        s.select("gpus", slice(None, None, 0))


# -- MeshTrait.slice -----------------------------------------------------------------------


def test_slice_int_removes_and_slice_keeps() -> None:
    s = mesh(hosts=4, gpus=3)
    assert s.slice(hosts=1).labels == ["gpus"]
    assert s.slice(hosts=1).ranks() == [3, 4, 5]
    kept = s.slice(hosts=slice(1, 2))
    assert kept.labels == ["hosts", "gpus"]
    assert kept.ranks() == [3, 4, 5]
    assert s.slice(hosts=slice(0, 2), gpus=slice(1, 3)).ndslice == Slice(1, [2, 2], [3, 1])
    assert s.slice(hosts=2, gpus=0).ranks() == [6]
    assert s.slice() == s


def test_slice_python_range_semantics() -> None:
    s = mesh(gpus=8)
    assert s.slice(gpus=slice(-3, None)).ranks() == [5, 6, 7]
    assert s.slice(gpus=slice(None, -6)).ranks() == [0, 1]
    assert s.slice(gpus=slice(None, None, 3)).ranks() == [0, 3, 6]
    assert s.slice(gpus=slice(2, 100)).ranks() == [2, 3, 4, 5, 6, 7]
    assert s.slice(gpus=range(1, 8, 2)).ranks() == [1, 3, 5, 7]
    assert len(s.slice(gpus=slice(5, 2))) == 0


def test_slice_of_a_slice_keeps_base_ranks() -> None:
    s = mesh(hosts=4, gpus=3).slice(hosts=slice(1, 4, 2))
    assert s.ranks() == [3, 4, 5, 9, 10, 11]
    assert s.slice(hosts=1, gpus=slice(1, None)).ranks() == [10, 11]


def test_slice_errors() -> None:
    s = mesh(hosts=2, gpus=3)
    with pytest.raises(TypeError, match=r"'cpus'.*'hosts', 'gpus'"):
        s.slice(cpus=0)
    with pytest.raises(IndexError, match="out of range"):
        s.slice(gpus=3)
    with pytest.raises(IndexError):
        s.slice(gpus=-1)
    with pytest.raises(ValueError, match="step"):
        s.slice(gpus=slice(None, None, -1))
    with pytest.raises(TypeError):
        s.slice(gpus="0")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        s.slice(gpus=True)


# -- flatten / rename / split / size ---------------------------------------------------


def test_flatten() -> None:
    s = mesh(hosts=2, gpus=3)
    flat = s.flatten("rank")
    assert flat == Shape(["rank"], Slice(0, [6], [1]))
    assert flat.slice(rank=0).ranks() == [0]
    # A contiguous sub-block stays flattenable.
    assert s.slice(hosts=1).flatten("r").ranks() == [3, 4, 5]
    # Size-1 dimensions do not break density.
    assert s.slice(hosts=slice(1, 2)).flatten("r").ranks() == [3, 4, 5]
    assert Shape.unity().flatten("r").ranks() == [0]


def test_flatten_rejects_sparse_shapes() -> None:
    sparse = mesh(hosts=2, gpus=3).slice(gpus=slice(0, 2))
    with pytest.raises(ValueError, match="cannot flatten sparse mesh"):
        sparse.flatten("rank")
    with pytest.raises(ValueError):
        mesh(gpus=4).slice(gpus=slice(None, None, 2)).flatten("rank")


def test_rename() -> None:
    s = mesh(host=2, gpu=3)
    renamed = s.rename(host="dp", gpu="tp")
    assert renamed.labels == ["dp", "tp"]
    assert renamed.ndslice == s.ndslice
    assert s.rename(host="dp").labels == ["dp", "gpu"]
    assert s.rename(host="gpu", gpu="host").labels == ["gpu", "host"]
    with pytest.raises(ValueError, match="'cpu'"):
        s.rename(cpu="x")
    with pytest.raises(ValueError, match="Duplicate dimension name"):
        s.rename(host="gpu")


def test_split_monarch_example() -> None:
    s = mesh(host=32, gpu=8)
    split = s.split(host=("dp", "pp"), gpu=("tp", "cp"), pp=16, cp=2)
    assert split.sizes == {"dp": 2, "pp": 16, "tp": 4, "cp": 2}
    assert split.ndslice.strides == [128, 8, 2, 1]
    assert split.ranks() == s.ranks()


def test_split_of_a_strided_view() -> None:
    s = mesh(hosts=2, gpus=8).slice(gpus=slice(0, 8, 2))
    split = s.split(gpus=("a", "b"), a=2)
    assert split.sizes == {"hosts": 2, "a": 2, "b": 2}
    assert split.ranks() == s.ranks() == [0, 2, 4, 6, 8, 10, 12, 14]
    assert split.slice(a=1).ranks() == [4, 6, 12, 14]


def test_split_errors() -> None:
    s = mesh(host=6, gpu=4)
    with pytest.raises(ValueError, match="not evenly divided"):
        s.split(host=("a", "b"), a=4)
    with pytest.raises(ValueError, match="not evenly divided"):
        s.split(host=("a", "b"), a=2, b=2)
    with pytest.raises(ValueError, match="Cannot infer"):
        s.split(host=("a", "b", "c"), a=1)
    with pytest.raises(ValueError, match="unused size constraints"):
        s.split(host=("a", "b"), a=2, z=3)
    with pytest.raises(ValueError, match="not an existing dim"):
        s.split(host=("a", "b"), a="2")
    with pytest.raises(ValueError, match="sequence"):
        s.split(host="a")
    with pytest.raises(ValueError, match="Duplicate"):
        s.split(host=("gpu", "b"), b=3)
    with pytest.raises(ValueError, match="Duplicate"):
        s.split(host=("a", "a"))
    with pytest.raises(ValueError, match="> 0"):
        s.split(host=("a", "b"), a=0)


def test_size() -> None:
    s = mesh(hosts=2, gpus=3)
    assert s.size() == 6
    assert s.size("gpus") == 3
    assert s.size(["hosts", "gpus"]) == 6
    assert s.size([]) == 1
    with pytest.raises(KeyError, match="cpus"):
        s.size("cpus")
    with pytest.raises(DimensionNotFoundError):
        s.size(["hosts", "cpus"])


# -- properties against brute force ------------------------------------------------------


@st.composite
def shapes_and_views(draw: st.DrawFn) -> tuple[Shape, dict[str, object]]:
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    labels = [f"d{i}" for i in range(len(sizes))]
    shape = Shape(labels, Slice.new_row_major(sizes))
    view: dict[str, object] = {}
    for label, n in zip(labels, sizes, strict=True):
        kind = draw(st.sampled_from(["keep", "int", "slice"]))
        if kind == "int":
            view[label] = draw(st.integers(0, n - 1))
        elif kind == "slice":
            start = draw(st.none() | st.integers(-n, n))
            stop = draw(st.none() | st.integers(-n, n))
            step = draw(st.none() | st.integers(1, 3))
            view[label] = slice(start, stop, step)
    return shape, view


def _brute_force(shape: Shape, view: dict[str, object]) -> list[int]:
    sizes = shape.ndslice.sizes
    axes = []
    for label, n in zip(shape.labels, sizes, strict=True):
        choice = view.get(label)
        if choice is None:
            axes.append(list(range(n)))
        elif isinstance(choice, slice):
            axes.append(list(range(n))[choice])
        else:
            assert isinstance(choice, int)
            axes.append([choice])
    return [shape.ndslice.nditem(list(c)) for c in itertools.product(*axes)]


@given(shapes_and_views())
def test_property_slice_matches_coordinate_filtering(case: tuple[Shape, dict[str, object]]) -> None:
    shape, view = case
    sliced = shape.slice(**view)  # type: ignore[arg-type]
    assert sliced.ranks() == _brute_force(shape, view)
    assert sliced.labels == [lab for lab in shape.labels if not isinstance(view.get(lab), int)]


@given(shapes_and_views())
def test_property_at_select_compose_like_slice(case: tuple[Shape, dict[str, object]]) -> None:
    shape, view = case
    composed = shape
    for label, choice in view.items():
        if isinstance(choice, slice):
            if not range(*choice.indices(composed.size(label))):
                return  # select() rejects empty ranges by design
            composed = composed.select(label, choice)
    for label, choice in view.items():
        if isinstance(choice, int):
            composed = composed.at(label, choice)
    assert composed == shape.slice(**view)  # type: ignore[arg-type]


@given(shapes_and_views())
def test_property_rank_of_inverts_ranks(case: tuple[Shape, dict[str, object]]) -> None:
    shape, view = case
    sliced = shape.slice(**view)  # type: ignore[arg-type]
    for i, rank in enumerate(sliced.ranks()):
        assert sliced.rank_of(rank) == i
        assert sliced.point_of_base_rank(rank).rank == i
