import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TQDM_DISABLE", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

from hypothesis import settings  # noqa: E402

# Property tests draw the same examples on every run (CI must not depend on the draw). A case found
# with random draws and not yet fixed: the dual from a solved acceptance within 1e-5 of 1 at a
# budget near 1e-20 (p = [6.2e-6, 1 - 6.2e-6], q = [3e-14, 1]) lands at another (a, b); it belongs
# to the float-range work of the reliability issue.
settings.register_profile("mdboost", derandomize=True, print_blob=True)
settings.load_profile("mdboost")
