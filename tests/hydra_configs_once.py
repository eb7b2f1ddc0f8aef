"""Hydra parses the package's YAML configs anew on every ``compose`` (in pure-Python YAML: about half of a compose's
0.2 s), and the suite composes hundreds of times. The package's files do not change during a session, so each is
parsed once here and every compose gets its own copy; configs from a folder (a user's ``--config-path``) are read
as always."""

import copy
import sys


def parse_package_configs_once() -> None:
    from hydra.core.plugins import Plugins

    Plugins.instance()  # the plugin scan loads the config sources' module anew: patch the class it holds
    module = sys.modules["hydra._internal.core_plugins.importlib_resources_config_source"]
    source, load, parsed = module.ImportlibResourcesConfigSource, module.ImportlibResourcesConfigSource.load_config, {}

    def load_config(self, config_path):
        key = (self.provider, self.path, config_path)
        if key not in parsed:
            parsed[key] = load(self, config_path)
        return copy.deepcopy(parsed[key])

    source.load_config = load_config
