"""gamfunc.schedules, below estimators and optimisers; its former name gamfunc.optim.schedules."""

import pytest
import torch

import gamfunc
from gamfunc import schedules


def test_former_name_gives_the_same_schedules():
    from gamfunc.optim import schedules as former

    assert gamfunc.schedules is schedules
    assert former.__all__ == schedules.__all__
    assert all(getattr(former, n) is getattr(schedules, n) for n in schedules.__all__)


def test_a_schedule_read_by_the_step_counter():
    lr = schedules.cosine(0.1, total_steps=100, warmup_steps=10)
    assert float(schedules.value(lr, torch.tensor(5))) == pytest.approx(0.06)
    assert schedules.value(0.3, torch.tensor(5)) == 0.3
