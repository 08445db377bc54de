"""gamfunc.schedules, below estimators and optimisers."""

import pytest
import torch

from gamfunc import schedules


def test_a_schedule_read_by_the_step_counter():
    lr = schedules.cosine(0.1, total_steps=100, warmup_steps=10)
    assert float(schedules.value(lr, torch.tensor(5))) == pytest.approx(0.06)
    assert schedules.value(0.3, torch.tensor(5)) == 0.3
