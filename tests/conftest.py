import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TQDM_DISABLE", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

from hypothesis import settings  # noqa: E402

# Property tests draw the same examples on every run (CI must not depend on the draw).
settings.register_profile("mdboost", derandomize=True, print_blob=True)
settings.load_profile("mdboost")
