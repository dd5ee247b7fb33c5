"""``ProcMesh.to_table()``'s drawing: the same text as Monarch's ``tensor_to_table`` (torchmonarch
0.7.0) for the same mesh (the expected strings are its output)."""

from __future__ import annotations

import pytest

from regency._runtime.actors.meshes.mesh_table import mesh_table

pytestmark = pytest.mark.timeout(30)


def _cells(n: int) -> list[str]:
    return [f"{x // 2}.gpu[{x % 2}]" for x in range(n)]


def test_two_dimensions_name_rows_on_the_left_and_columns_above() -> None:
    assert mesh_table(["hosts", "gpus"], [2, 2], _cells(4)) == (
        "                     gpus          \n"
        "      │+----+----------+----------+\n"
        "      │|    |        0 |        1 |\n"
        "      │+====+==========+==========+\n"
        "hosts │|  0 | 0.gpu[0] | 0.gpu[1] |\n"
        "      │+----+----------+----------+\n"
        "      │|  1 | 1.gpu[0] | 1.gpu[1] |\n"
        "      │+----+----------+----------+"
    )


def test_three_dimensions_draw_one_table_per_index_of_the_first() -> None:
    assert mesh_table(["zone", "hosts", "gpus"], [2, 1, 2], _cells(4)) == (
        "zone: 0\n"
        "                     gpus          \n"
        "      │+----+----------+----------+\n"
        "      │|    |        0 |        1 |\n"
        "hosts │+====+==========+==========+\n"
        "      │|  0 | 0.gpu[0] | 0.gpu[1] |\n"
        "      │+----+----------+----------+\n"
        "\n"
        "zone: 1\n"
        "      │+----+----------+----------+\n"
        "      │|    |        0 |        1 |\n"
        "hosts │+====+==========+==========+\n"
        "      │|  0 | 1.gpu[0] | 1.gpu[1] |\n"
        "      │+----+----------+----------+"
    )


@pytest.mark.parametrize("sizes", [[], [1, 1, 1, 1]])
def test_other_dimension_counts_are_refused(sizes: list[int]) -> None:
    with pytest.raises(ValueError, match=f"1 to 3 dimensions, not {len(sizes)}"):
        mesh_table(["d"] * len(sizes), sizes, ["x"])
