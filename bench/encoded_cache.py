"""The encoded cache measured two ways on SST-2 and IMDB (every split of the local copy): the project's own
(data/encoded.py: ids to a scratch file, torch.save, read back with torch.load mmap) against `datasets`' own
(Dataset.map into an Arrow cache file, read back memory-mapped with Dataset.from_file, viewed as flat ids without a
copy, and with_format("torch") read in batches of 64). The tokenizer is trained once beforehand (train-tokenizer:
/tmp/h48d/enc/tok-<dataset>.json), so only reading, encoding and the cache are measured; then one pass over every
training item. Run each mode twice on an empty CACHE_DIR (cold, then warm) under /usr/bin/time -v (max RSS):
    ATTENTION_DATA_ROOT=../shared/data /usr/bin/time -v python -m bench.encoded_cache current imdb /tmp/c
usage: python -m bench.encoded_cache MODE DATASET CACHE_DIR    MODE: current | datasets | train-tokenizer"""
import sys, time, resource, os
from pathlib import Path
import torch
mode, name, cache = sys.argv[1], sys.argv[2], Path(sys.argv[3])
os.environ.setdefault("ATTENTION_DATA_ROOT", "/work/shared/data")
from data.sources import load_splits
from data.tokenizer import load_tokenizer, train_tokenizer, CutTexts, cut, UNK_ID
from data.encoded import EncodedSplit, encode_splits, ENCODE_CHUNK
settings = {"sst2": dict(tokenizer="word", max_length=64, vocab=16000), "imdb": dict(tokenizer="word", max_length=3072, vocab=30000)}[name]
tok_file = Path(f"/tmp/h48d/enc/tok-{name}.json")
def splits():
    return load_splits(dataset=name, data_dir=None, train_file=None, val_file=None, test_file=None, text_column=None,
                       label_column=None, val_fraction=0.1, seed=0)
start = time.perf_counter()
if mode == "train-tokenizer":
    s = splits()
    t = train_tokenizer(CutTexts(s.texts["train"], settings["max_length"]), vocab_size=settings["vocab"], max_length=settings["max_length"], kind=settings["tokenizer"])
    tok_file.write_text(t.to_str()); sys.exit()
tokenizer = load_tokenizer(tok_file.read_text(), max_length=settings["max_length"])
L = settings["max_length"]
cache.mkdir(parents=True, exist_ok=True)
if mode == "current":
    path = cache / f"{name}.pt"
    if not path.exists():
        s = splits()
        enc = encode_splits(tokenizer, s, L)
        torch.save({n: e.state() for n, e in enc.items()}, path)
        del enc, s
    loaded = torch.load(path, weights_only=True, mmap=True)
    encoded = {n: EncodedSplit(**st) for n, st in loaded.items()}
elif mode == "datasets":
    import datasets, pyarrow as pa
    datasets.disable_progress_bars()
    features = datasets.Features({"label": datasets.Value("int64"), "input_ids": datasets.List(datasets.Value("int32"))})
    def encode(batch):
        return {"input_ids": [e.ids or [UNK_ID] for e in tokenizer.encode_batch(cut(batch["text"], L))]}
    names = {"sst2": ["train", "validation"], "imdb": ["train", "validation", "test"]}[name]
    paths = {n: cache / f"{name}-{n}.arrow" for n in names}
    if not all(p.exists() for p in paths.values()):
        s = splits()
        assert sorted(s.texts) == sorted(names), sorted(s.texts)
        for n in names:
            col = s.texts[n]
            texts = pa.chunked_array([c for c in [col.column.take(pa.array(col.row_numbers()))]]) if hasattr(col, "column") else pa.array(list(col))
            table = pa.table({"text": texts, "label": pa.array(s.labels[n], pa.int64())})
            datasets.Dataset(table).map(encode, batched=True, batch_size=ENCODE_CHUNK, remove_columns=["text"],
                                        features=features, cache_file_name=str(paths[n]), new_fingerprint=f"{name}-{n}")
            del table, texts
        del s
    encoded = {}
    for n in names:
        ds = datasets.Dataset.from_file(str(paths[n]))
        ids = ds.data.column("input_ids").combine_chunks()  # memory-mapped Arrow: values and offsets without a copy
        encoded[n] = EncodedSplit(torch.from_numpy(ids.values.to_numpy(zero_copy_only=True)),
                                  torch.from_numpy(ids.offsets.to_numpy().astype("int64")),
                                  torch.from_numpy(ds.data.column("label").to_numpy()))
        encoded[n + "_torch"] = ds.with_format("torch")
ready = time.perf_counter() - start
t = time.perf_counter(); n_tokens = sum(len(encoded["train"][i][0]) for i in range(len(encoded["train"]))); item_pass = time.perf_counter() - t
extra = ""
if mode == "datasets":
    ds = encoded["train_torch"]; t = time.perf_counter()
    batches = [ds.__getitems__(list(range(a, min(a + 64, len(ds))))) for a in range(0, len(ds), 64)]
    extra = f" with_format(torch) pass {time.perf_counter() - t:.1f}s"
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"{mode} {name}: ready {ready:.1f}s, item pass {item_pass:.1f}s ({n_tokens} tokens),{extra} peak RSS {peak:.0f} MiB, cache {sum(f.stat().st_size for f in cache.iterdir())/2**20:.0f} MiB")
