"""sentence-transformers code running on streampool: two lines change.

    python crates/streampool-py/examples/swap_sentence_transformers.py [MODEL_FOLDER]

MODEL_FOLDER: a sentence-transformers model folder (config.json, tokenizer.json,
model.safetensors), e.g. all-MiniLM-L6-v2's; default: the shipped models/tiny-bert.
"""

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# from sentence_transformers import SentenceTransformer                  # before
from streampool import SentenceEmbedder as SentenceTransformer          # after (1/2)

folder = sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).parents[3] / "models" / "tiny-bert")
# model = SentenceTransformer(folder, device="cuda")                      # before
model = SentenceTransformer(folder, device="cpu")                         # after (2/2): "cuda" works too

sentences = ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
embeddings = model.encode(sentences, batch_size=32, normalize_embeddings=True)
print(embeddings.shape, embeddings.dtype)            # (3, dim) float32
print((embeddings @ embeddings.T).round(3))         # cosine similarities

# What sentence-transformers cannot do well: many Python threads at once. Each call releases
# the GIL and runs on its own stream of the device.
with ThreadPoolExecutor(16) as pool:
    vectors = list(pool.map(model.encode, [f"request {i}" for i in range(64)]))
print(len(vectors), vectors[0].shape)
