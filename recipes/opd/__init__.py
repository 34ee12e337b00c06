from recipes.opd.recipe import OPDConfig, OPDRecipe as Recipe

__all__ = ["Recipe", "OPDConfig"]
