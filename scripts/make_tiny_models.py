#!/usr/bin/env python3
"""Generate the tiny random-weight checkpoints of the model families streampool-nn serves
beyond BERT, under models/:

  tiny-xlmr           XLM-RoBERTa encoder (RoBERTa positions, SentencePiece/Unigram
                      tokenizer), with sentence-transformers files: CLS pooling, Normalize,
                      prompts ("query", "passage")
  tiny-xlmr-reranker  XLMRobertaForSequenceClassification, one label (a cross-encoder
                      reranker such as bge-reranker)
  tiny-bert-classifier BertForSequenceClassification, three labels with names (a
                      classifier, the shape of cross-encoder/ms-marco-* with num_labels 3)
  tiny-mpnet          MPNet (relative position bias), mean pooling + Normalize
  tiny-gte            Alibaba GTE, transformers' port (rotary positions, GeGLU MLP,
                      post-norm), CLS pooling
  tiny-nomic          NomicBERT (rotary positions, SwiGLU MLP, no biases, post-norm), mean
                      pooling + Normalize, prompts "query" / "document" ("search_query: ", ...)
  tiny-modernbert     ModernBERT (3 layers: one global, two sliding-window layers of half
                      width 4, rotary bases 1600 / 100, GeGLU, norms without bias, pre-norm),
                      mean pooling + Normalize
  tiny-qwen3          Qwen3 as an embedder (causal, grouped-query attention with 4 query
                      heads over 2 key/value heads, q/k RMSNorm, RoPE, SwiGLU, pre-norm,
                      left padding), last-token pooling + Normalize, with an instruction
                      prompt

Each is 2 layers, 32 wide, with a tokenizer trained here on a few sentences (vocabularies of
a few hundred tokens), so the folders are kilobytes. Weights: linear weights N(0, 1/fan_in)
(as scripts/make_tiny_bert.py, so attention is far from uniform and a wrong scale, mask or
position shows), embeddings N(0, 1), biases N(0, 0.1), norms' gamma 1 + N(0, 0.1) and beta
N(0, 0.1); float32; fixed seeds. The classification heads get N(0, 1/fan_in) too.

Tokenizers: the `tokenizers` trainers are not deterministic (their vocabulary order follows
hash-map order), so a folder's existing tokenizer.json is kept and only a missing one is
trained (--retrain-tokenizers trains all again; the references must then be remade). With
the tokenizers kept, the weights are byte-identical on every run (fixed seeds).

Usage: python3 scripts/make_tiny_models.py [--out models] [--retrain-tokenizers]
Needs: torch, transformers, tokenizers (scripts/requirements-reference.txt).
"""
import argparse
import json
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

SEED = 20261124
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello! What is the capital of France? Paris is the capital of France.",
    "A stream pool lets many threads share one GPU without serializing every request.",
    "Rust has no global interpreter lock, and threads are cheap.",
    "Café crème, naïve résumé, déjà vu: accents are tokens too.",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "El rápido zorro marrón salta sobre el perro perezoso.",
    "Le renard brun rapide saute par-dessus le chien paresseux.",
    "Numbers such as 3.14159 and 2026, e-mail@example.com, GPU and CPU.",
    "query: how do rerankers score a passage? passage: a cross-encoder reads both texts.",
    "Instruct: Given a web search query, retrieve relevant passages that answer the query",
    "Embeddings, classifiers and rerankers are the models users serve.",
]


def corpus_iter():
    for _ in range(4):
        yield from CORPUS


def unigram_tokenizer(vocab: int) -> Tokenizer:
    """XLM-RoBERTa's pipeline (Metaspace, Unigram, <s> $A </s>) with a tiny vocabulary."""
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab, special_tokens=["<s>", "<pad>", "</s>", "<unk>"], unk_token="<unk>", shrinking_factor=0.9
    )
    tok.train_from_iterator(corpus_iter(), trainer)
    tok.add_special_tokens(["<mask>"])
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    return tok


def wordpiece_tokenizer(vocab: int, specials: list, cls: str, sep: str, roberta_pairs: bool) -> Tokenizer:
    """BERT's pipeline (lower case, BertPreTokenizer, WordPiece) with a tiny vocabulary."""
    unk = "[UNK]" if "[UNK]" in specials else "<unk>"
    tok = Tokenizer(models.WordPiece(unk_token=unk))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=None, clean_text=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab, special_tokens=specials)
    tok.train_from_iterator(corpus_iter(), trainer)
    c, s = tok.token_to_id(cls), tok.token_to_id(sep)
    if roberta_pairs:
        tok.post_processor = processors.RobertaProcessing((sep, s), (cls, c))
    else:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1", special_tokens=[(cls, c), (sep, s)]
        )
    tok.decoder = decoders.WordPiece()
    return tok


def bpe_tokenizer(vocab: int) -> Tokenizer:
    """Qwen's pipeline (byte-level BPE, no BOS, <|endoftext|> appended) with a tiny vocabulary."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus_iter(), trainer)
    eos = tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(
        single="$A <|endoftext|>", pair="$A <|endoftext|> $B:1 <|endoftext|>:1", special_tokens=[("<|endoftext|>", eos)]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


RETRAIN = False


def kept_or_trained(folder: Path, train) -> Tokenizer:
    """The folder's committed tokenizer.json, or a new one from `train()`."""
    path = folder / "tokenizer.json"
    if path.exists() and not RETRAIN:
        return Tokenizer.from_file(str(path))
    return train()


def reinit(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if p.dim() == 2 and "embed" not in name and "relative_attention_bias" not in name:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
            elif p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g))
            elif "norm" in name.lower() and name.endswith("weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n")


def tokenizer_config(out: Path, pad: str, padding_side: str = "right", max_len: int = 64) -> None:
    """tokenizer_config.json: what transformers' AutoTokenizer (and so sentence-transformers)
    needs beside tokenizer.json, and where streampool reads the pad token and side."""
    write_json(out / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "pad_token": pad, "padding_side": padding_side,
        "model_max_length": max_len})


def sentence_transformers_files(out: Path, pooling: str, normalize: bool, prompts: dict, max_len: int) -> None:
    """modules.json, 1_Pooling/config.json, config_sentence_transformers.json, sentence_bert_config.json."""
    mods = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        mods.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (out / "2_Normalize").mkdir(parents=True, exist_ok=True)
    write_json(out / "modules.json", mods)
    write_json(out / "1_Pooling/config.json", {
        "word_embedding_dimension": 32,
        "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": pooling == "lasttoken",
        "include_prompt": True,
    })
    write_json(out / "config_sentence_transformers.json", {
        "prompts": prompts, "default_prompt_name": None, "similarity_fn_name": "cosine"})
    write_json(out / "sentence_bert_config.json", {"max_seq_length": max_len, "do_lower_case": False})


def save(model, tok: Tokenizer, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    # A kept tokenizer is not written again: a load/save round trip reformats its floats.
    if RETRAIN or not (out / "tokenizer.json").exists():
        tok.save(str(out / "tokenizer.json"))
    for extra in ("generation_config.json",):
        (out / extra).unlink(missing_ok=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "models"))
    ap.add_argument("--retrain-tokenizers", action="store_true")
    args = ap.parse_args()
    global RETRAIN
    RETRAIN = args.retrain_tokenizers
    root = Path(args.out)
    import transformers as tr

    common = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)

    # XLM-RoBERTa embedder and reranker share one tokenizer.
    xtok = kept_or_trained(root / "tiny-xlmr", lambda: unigram_tokenizer(300))
    xcfg = dict(common, vocab_size=xtok.get_vocab_size(), max_position_embeddings=66, type_vocab_size=1,
                pad_token_id=1, bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5)
    torch.manual_seed(SEED)
    m = tr.XLMRobertaModel(tr.XLMRobertaConfig(**xcfg), add_pooling_layer=False)
    reinit(m, SEED)
    save(m, xtok, root / "tiny-xlmr")
    sentence_transformers_files(root / "tiny-xlmr", "cls", True, {"query": "query: ", "passage": "passage: "}, 64)
    tokenizer_config(root / "tiny-xlmr", "<pad>")

    m = tr.XLMRobertaForSequenceClassification(tr.XLMRobertaConfig(**xcfg, num_labels=1))
    reinit(m, SEED + 1)
    save(m, xtok, root / "tiny-xlmr-reranker")
    tokenizer_config(root / "tiny-xlmr-reranker", "<pad>")

    btok = kept_or_trained(root / "tiny-bert-classifier", lambda: wordpiece_tokenizer(
        250, ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], "[CLS]", "[SEP]", False))
    bcfg = dict(common, vocab_size=btok.get_vocab_size(), max_position_embeddings=64, type_vocab_size=2,
                pad_token_id=0, num_labels=3, id2label={0: "negative", 1: "neutral", 2: "positive"},
                label2id={"negative": 0, "neutral": 1, "positive": 2})
    m = tr.BertForSequenceClassification(tr.BertConfig(**bcfg))
    reinit(m, SEED + 2)
    save(m, btok, root / "tiny-bert-classifier")
    tokenizer_config(root / "tiny-bert-classifier", "[PAD]")

    mtok = kept_or_trained(root / "tiny-mpnet", lambda: wordpiece_tokenizer(
        250, ["<s>", "<pad>", "</s>", "<unk>", "[UNK]", "<mask>"], "<s>", "</s>", True))
    mcfg = dict(common, vocab_size=mtok.get_vocab_size(), max_position_embeddings=66, pad_token_id=1,
                bos_token_id=0, eos_token_id=2, relative_attention_num_buckets=32, layer_norm_eps=1e-5)
    m = tr.MPNetModel(tr.MPNetConfig(**mcfg), add_pooling_layer=False)
    reinit(m, SEED + 3)
    save(m, mtok, root / "tiny-mpnet")
    sentence_transformers_files(root / "tiny-mpnet", "mean", True, {}, 64)
    tokenizer_config(root / "tiny-mpnet", "<pad>")

    gtok = kept_or_trained(root / "tiny-gte", lambda: wordpiece_tokenizer(
        250, ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], "[CLS]", "[SEP]", False))
    gcfg = dict(common, vocab_size=gtok.get_vocab_size(), max_position_embeddings=64, type_vocab_size=2,
                pad_token_id=0, layer_norm_eps=1e-12, hidden_act="gelu",
                rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    m = tr.GteModel(tr.GteConfig(**gcfg))
    reinit(m, SEED + 4)
    save(m, gtok, root / "tiny-gte")
    sentence_transformers_files(root / "tiny-gte", "cls", True, {}, 64)
    tokenizer_config(root / "tiny-gte", "[PAD]")

    ntok = kept_or_trained(root / "tiny-nomic", lambda: wordpiece_tokenizer(
        250, ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], "[CLS]", "[SEP]", False))
    ncfg = dict(common, vocab_size=ntok.get_vocab_size(), max_position_embeddings=64, type_vocab_size=2,
                pad_token_id=0, layer_norm_eps=1e-12, hidden_act="silu",
                rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
    m = tr.NomicBertModel(tr.NomicBertConfig(**ncfg))
    reinit(m, SEED + 6)
    save(m, ntok, root / "tiny-nomic")
    sentence_transformers_files(root / "tiny-nomic", "mean", True,
                                {"query": "search_query: ", "document": "search_document: "}, 64)
    tokenizer_config(root / "tiny-nomic", "[PAD]")

    mbtok = kept_or_trained(root / "tiny-modernbert", lambda: wordpiece_tokenizer(
        250, ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], "[CLS]", "[SEP]", False))
    mbcfg = dict(vocab_size=mbtok.get_vocab_size(), hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                 num_attention_heads=2, max_position_embeddings=64, hidden_activation="gelu", norm_eps=1e-5,
                 local_attention=8, global_attn_every_n_layers=3,
                 rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1600.0},
                                  "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}},
                 pad_token_id=0, bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3)
    m = tr.ModernBertModel(tr.ModernBertConfig(**mbcfg))
    reinit(m, SEED + 7)
    save(m, mbtok, root / "tiny-modernbert")
    sentence_transformers_files(root / "tiny-modernbert", "mean", True, {"query": "search_query: "}, 64)
    tokenizer_config(root / "tiny-modernbert", "[PAD]")

    qtok = kept_or_trained(root / "tiny-qwen3", lambda: bpe_tokenizer(300))
    qcfg = dict(vocab_size=qtok.get_vocab_size(), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                rms_norm_eps=1e-6, hidden_act="silu", tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
                pad_token_id=qtok.token_to_id("<|endoftext|>"), eos_token_id=qtok.token_to_id("<|endoftext|>"))
    m = tr.Qwen3Model(tr.Qwen3Config(**qcfg))
    reinit(m, SEED + 5)
    save(m, qtok, root / "tiny-qwen3")
    sentence_transformers_files(
        root / "tiny-qwen3", "lasttoken", True,
        {"query": "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:",
         "document": ""}, 64)
    tokenizer_config(root / "tiny-qwen3", "<|endoftext|>", padding_side="left")
    for d in sorted(root.glob("tiny-*")):
        size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
        print(f"{d.name}: {size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
