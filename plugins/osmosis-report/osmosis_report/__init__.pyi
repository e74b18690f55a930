from osmosis_report.compare import Comparison as Comparison
from osmosis_report.compare import compare as compare
from osmosis_report.load import RunData as RunData
from osmosis_report.load import load_run as load_run
from osmosis_report.render import Built as Built
from osmosis_report.render import build_report as build_report
from osmosis_report.settings import ReportSettings as ReportSettings
from osmosis_report.stats import mean_interval as mean_interval
from osmosis_report.stats import paired_bootstrap as paired_bootstrap
from osmosis_report.stats import pass_at_k as pass_at_k

__version__: str
