-- Owner types and source tables outside the legacy enums (decision 111). Only adds: a previous
-- release keeps serving this file.
--
-- owner_type and table_name keep their numbers: a legacy name's wire number (1..=3, 1..=5), or
-- for any other name a fixed function of it in 16..=32767 (OwnerType::store_number), so that
-- claims_by_cell_table_record still narrows a listing to one table. The name is kept beside
-- the number, NULL for the legacy names (whose number says it, as for every row written before
-- this migration); two names may share a number, and listings compare both.
ALTER TABLE claims ADD COLUMN owner_type_name text COLLATE "C";
ALTER TABLE claims ADD COLUMN source_table text COLLATE "C";
