"""interp.heads: one head type, one label, one parser."""
import json

import pytest

from interp.errors import BadInput
from interp.heads import Head, KVHead, head_label, parse_head, parse_label


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


@pytest.mark.parametrize("label, parsed", [
    ("L1H2", Head(1, 2)), (" l1 h2 ", Head(1, 2)), ("L01H002", Head(1, 2)), ("L10H11", Head(10, 11)),
    ("L1KV0", KVHead(1, 0)), ("l3 kv2", KVHead(3, 2)), ("L0Kv1", KVHead(0, 1)),
])
def test_parse_label_reads_query_and_key_value_heads(label, parsed):
    got = parse_label(label)
    assert got == parsed and type(got) is type(parsed)


@pytest.mark.parametrize("label", ["L 1H2", "L1H-2", "L1.0H2", "L1H2H3", "H2", "L1", "L1 K V0", "L\u0661H2", "", "L1H2x"])
def test_parse_label_refuses_everything_else(label):
    with pytest.raises(BadInput, match="is not a head label"):
        parse_label(label)


def test_a_key_value_head_is_not_the_query_head_of_the_same_index():
    kv = KVHead(1, 0)
    assert kv != Head(1, 0) and kv != (1, 0)
    assert kv.label == str(kv) == "L1KV0" and parse_label(kv.label) == kv
    assert {kv, Head(1, 0)} == {Head(1, 0), KVHead(1, 0)} and len({kv, Head(1, 0)}) == 2


def test_parse_head_refuses_a_key_value_head_label():
    with pytest.raises(BadInput, match=r"'L1KV0' names key/value head L1KV0.*name one query head.*'L1H0'"):
        parse_head("L1KV0")
