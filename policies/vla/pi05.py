"""LeRobot pi0.5 as a FlowPolicy: the state is discretised into 256 bins and written into the prompt
("Task: ..., State: ...;\\nAction: ", as LeRobot's pi05 processor does), so the prefix carries it; the adaRMS action
expert reads only the noisy chunk and the time (``denoise_step(pad, kv, x_t, t)``). Value head on the mean of the VLM's
prefix output over image and language tokens (pi_RL's pi0.5 critic)."""

from __future__ import annotations

import numpy as np
import torch

from .adapter import VLAEncoding, VLAPolicy
from .pi0 import prefix_forward


def state_prompts(instruction: str | list[str], state: torch.Tensor) -> list[str]:
    """LeRobot's ``Pi05PrepareStateTokenizerProcessorStep``: the normalised state in 256 bins over [-1, 1]; one
    instruction for every row or each row's own."""
    bins = np.digitize(state.detach().cpu().numpy(), bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1
    texts = [instruction] * len(bins) if isinstance(instruction, str) else instruction
    return [f"Task: {text.strip().replace('_', ' ').replace(chr(10), ' ')}, State: {' '.join(map(str, row))};\nAction: "
            for text, row in zip(texts, bins, strict=True)]


class PI05Adapter(VLAPolicy):
    value_on_expert = False

    def _prefix_width(self) -> int:
        return self.model.paligemma_with_expert.paligemma.config.text_config.hidden_size

    def _prefix(self, batch: dict[str, torch.Tensor], bsize: int):
        device = next(self.model.parameters()).device
        images, img_masks = self.lerobot._preprocess_images(batch)
        instruction = batch.get("task", self.instruction)  # each env's own (the suite) or the fixed one
        if "observation.state" in batch:
            prompts = state_prompts(instruction, batch["observation.state"])
        else:
            texts = [instruction] * bsize if isinstance(instruction, str) else instruction
            prompts = [f"Task: {text.strip()};\nAction: " for text in texts]
        tokens, masks = self.tokens(prompts, self.lerobot.config.tokenizer_max_length, device)
        embs, pad_masks, att_masks = self.model.embed_prefix(images, img_masks, tokens, masks)
        prefix_out, cache = prefix_forward(self.model, embs, pad_masks, att_masks)
        return prefix_out, cache, pad_masks, {}

    def _denoise(self, enc: VLAEncoding, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.model.denoise_step(prefix_pad_masks=enc.pad_masks, past_key_values=enc.cache(), x_t=x, timestep=t)
