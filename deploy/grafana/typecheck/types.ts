// Types the generated build/dashboard.check.ts checks the shipped dashboard against.
import type { Dashboard, Panel, RowPanel, DataQuery } from '@grafana/schema';
import type {
  Options as TimeSeriesOptions,
  FieldConfig as TimeSeriesFieldConfig,
} from '@grafana/schema/dist/esm/raw/composable/timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen';
import type { Options as StatOptions } from '@grafana/schema/dist/esm/raw/composable/stat/panelcfg/x/StatPanelCfg_types.gen';

// JSON carries enum members as their string values: accept exactly those values.
export type Json<T> = T extends string
  ? `${T}`
  : T extends (infer U)[]
    ? Json<U>[]
    : T extends object
      ? { [K in keyof T]: Json<T[K]> }
      : T;

// The Prometheus query model (the datasource's own type is no longer part of @grafana/schema).
export interface PrometheusQuery extends DataQuery {
  expr: string;
  legendFormat?: string;
  range?: boolean;
  instant?: boolean;
  interval?: string;
}

export type ShippedDashboard = Json<Dashboard>;
export type TimeSeriesPanel = Json<Omit<Panel<TimeSeriesOptions, TimeSeriesFieldConfig>, 'targets'>> & {
  type: 'timeseries';
  options: Json<TimeSeriesOptions>;
  targets: Json<PrometheusQuery>[];
};
export type StatPanel = Json<Omit<Panel<StatOptions>, 'targets'>> & {
  type: 'stat';
  options: Json<StatOptions>;
  targets: Json<PrometheusQuery>[];
};
export type Row = Json<RowPanel> & { type: 'row' };
