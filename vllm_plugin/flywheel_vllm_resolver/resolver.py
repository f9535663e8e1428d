"""The resolver vLLM calls: a :class:`~.fetch.AdapterFetcher` behind vLLM's interface."""

from __future__ import annotations

from vllm.logger import init_logger
from vllm.lora.request import LoRARequest
from vllm.lora.resolver import LoRAResolver

from flywheel_vllm_resolver import LOGGER_NAME
from flywheel_vllm_resolver.fetch import AdapterFetcher, FetchSettings, stable_lora_id

logger = init_logger(LOGGER_NAME)


class FlywheelResolver(LoRAResolver):
    """Fetches an unknown ``<line>-v<version>`` adapter from flywheel's registry."""

    def __init__(self, settings: FetchSettings, fetcher: AdapterFetcher | None = None) -> None:
        self.fetcher = fetcher or AdapterFetcher(settings)

    async def resolve_lora(self, base_model_name: str, lora_name: str) -> LoRARequest | None:
        """The adapter's request once fetched and verified; None (vLLM answers 404) when it
        cannot be, with the reason logged at WARNING. Never raises: vLLM does not catch."""
        outcome = await self.fetcher.fetch(lora_name)
        if outcome.path is None:
            logger.warning("flywheel resolver: %s not served: %s", lora_name, outcome.reason)
            return None
        logger.info("flywheel resolver: %s fetched into %s", lora_name, outcome.path)
        return LoRARequest(
            lora_name=lora_name,
            lora_int_id=stable_lora_id(lora_name),
            lora_path=str(outcome.path),
        )
