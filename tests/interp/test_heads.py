"""interp.heads: one head type, one label, one parser."""
import json

import pytest

from interp.errors import BadInput
from interp.heads import Head, head_label, parse_head


def test_head_is_the_pair_it_names():
    head = Head(1, 2)
    assert head == (1, 2) and hash(head) == hash((1, 2)) and tuple(head) == (1, 2)
    assert (head.layer, head.head) == (1, 2) and head.label == "L1H2" == head_label((1, 2)) == head_label(head)
    assert repr(head) == str(head) == "(1, 2)" and json.dumps([head]) == "[[1, 2]]"  # files and messages as before


@pytest.mark.parametrize("given", ["L1H2", " l1 h2 ", (1, 2), [1, 2], Head(1, 2)])
def test_parse_head_reads_labels_and_pairs(given):
    parsed = parse_head(given)
    assert parsed == (1, 2) and isinstance(parsed, Head)


@pytest.mark.parametrize("given, message", [
    ("L1X2", r"'L1X2' is not a head label: it is not of the form L\{layer\}H\{head\}"),
    ((1,), r"head \(1,\) is not a \(layer, head\) pair of integers"),
    ((True, 1), r"head \(True, 1\) is not a \(layer, head\) pair"),
    (3, "head 3 is not a"),
])
def test_parse_head_says_what_is_wrong(given, message):
    with pytest.raises(BadInput, match=message):
        parse_head(given)
