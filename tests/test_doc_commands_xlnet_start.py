"""Issue 31, the other chains of tests/test_doc_commands.py (a file of its own: pytest-xdist hands each file to one
worker, so the two files run side by side): the README's XLNet commands (pretraining, finetuning, export, the
multi-process launcher) and docs/getting-started.md; each chain runs as written, twice in a row, in a fresh working
directory."""

import pytest
import test_doc_commands as docs
from test_train_utils import compile_cache  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("doc_chain", ["readme-xlnet", "start"])
def test_document_commands_run_twice(doc_chain, tmp_path, compile_cache):  # noqa: F811
    docs.run_chain_twice(doc_chain, tmp_path, compile_cache)
