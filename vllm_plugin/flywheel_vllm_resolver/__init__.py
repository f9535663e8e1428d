"""flywheel's LoRA resolver, a vLLM general plugin (entry point ``flywheel_lora_resolver``).

``flywheel serve vllm`` names it in ``VLLM_PLUGINS`` and sets the fetch command,
the cache and the served base model in the environment (see :mod:`.fetch`);
vLLM then asks it for any adapter name it does not serve, on that name's first
request. Without that environment, :func:`register` does nothing, so installing
the plugin changes nothing for a vLLM started otherwise.
"""

from __future__ import annotations

PLUGIN_NAME = "flywheel_lora_resolver"
# Under vLLM's own logger, so its handler and format (and level) apply to these lines.
LOGGER_NAME = "vllm.plugins.flywheel_lora_resolver"


def register() -> None:
    """vLLM's plugin hook: register the resolver when `flywheel serve vllm` configured it."""
    # vLLM imports stay here, at the edge: the fetch logic is tested without vLLM.
    from vllm.logger import init_logger
    from vllm.lora.resolver import LoRAResolverRegistry

    from flywheel_vllm_resolver.fetch import FetchSettings, ResolverConfigError
    from flywheel_vllm_resolver.resolver import FlywheelResolver

    logger = init_logger(LOGGER_NAME)
    try:
        settings = FetchSettings.from_env()
    except ResolverConfigError as exc:
        logger.error("flywheel's LoRA resolver is not registered: %s", exc)
        return
    if settings is None:
        logger.debug("flywheel's LoRA resolver is not configured (no fetch command)")
        return
    LoRAResolverRegistry.register_resolver("flywheel", FlywheelResolver(settings))
    logger.info("flywheel's LoRA resolver registered: adapters fetched into %s", settings.cache_dir)
